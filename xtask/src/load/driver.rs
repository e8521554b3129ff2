//! The load driver: requests against one target, open loop at a fixed rate (latency from the
//! intended start time), closed loop at a fixed concurrency, and streams read chunk by chunk for
//! the time to the first content token and the gaps between content chunks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use hdrhistogram::Histogram;
use serde_json::{Value, json};

use super::conn::Connection;

pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where one path sends its requests.
#[derive(Clone)]
pub struct Target {
    pub url: String,
    /// Where the long streams go (the mock's shaped route when direct).
    pub long_url: String,
    pub key: Option<String>,
    pub body: Arc<String>,
    pub stream_body: Arc<String>,
    /// A streamed request for the long stream shape (the concurrent-streams phase).
    pub long_stream_body: Arc<String>,
}

impl Target {
    pub fn new(
        url: String,
        long_url: String,
        key: Option<&str>,
        model: &str,
        long_model: &str,
    ) -> Target {
        let body = |model: &str, stream: bool| {
            Arc::new(
                json!({"model": model, "stream": stream,
                       "messages": [{"role": "user", "content": "Say hi"}]})
                .to_string(),
            )
        };
        Target {
            url,
            long_url,
            key: key.map(str::to_owned),
            body: body(model, false),
            stream_body: body(model, true),
            long_stream_body: body(long_model, true),
        }
    }

    fn post(&self, client: &reqwest::Client, body: &str) -> reqwest::RequestBuilder {
        self.post_to(client, &self.url, body)
    }

    fn post_to(&self, client: &reqwest::Client, url: &str, body: &str) -> reqwest::RequestBuilder {
        let request = client
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_owned());
        match &self.key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }
}

pub fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .no_proxy()
        .http1_only()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(usize::MAX)
        .timeout(REQUEST_TIMEOUT)
        .build()?)
}

/// Latencies of one phase, in microseconds.
pub struct Outcome {
    pub histogram: Histogram<u64>,
    pub sent: u64,
    pub errors: u64,
    /// Of `errors`, requests Baton refused with 503 `OVERLOADED` (load shedding): they did
    /// nothing, so they have no log row.
    pub shed: u64,
    pub elapsed: Duration,
    /// The first failure, to say why a phase had errors.
    pub first_error: Option<String>,
}

impl Outcome {
    pub fn new() -> anyhow::Result<Outcome> {
        Ok(Outcome {
            histogram: histogram()?,
            sent: 0,
            errors: 0,
            shed: 0,
            elapsed: Duration::ZERO,
            first_error: None,
        })
    }

    pub fn record(&mut self, latency: Duration, result: Result<(), String>) {
        self.sent += 1;
        match result {
            Ok(()) => record(&mut self.histogram, latency),
            Err(error) => {
                self.errors += 1;
                if is_shed(&error) {
                    self.shed += 1;
                }
                self.first_error.get_or_insert(error);
            }
        }
    }

    pub fn quantile(&self, q: f64) -> u64 {
        self.histogram.value_at_quantile(q)
    }

    pub fn rps(&self) -> f64 {
        self.sent as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    pub fn error_rate(&self) -> f64 {
        self.errors as f64 / self.sent.max(1) as f64
    }

    pub fn json(&self) -> Value {
        let mut value = json!({
            "requests": self.sent,
            "errors": self.errors,
            "shed": self.shed,
            "rps": (self.rps() * 10.0).round() / 10.0,
        });
        if let (Some(object), Value::Object(quantiles)) =
            (value.as_object_mut(), quantiles(&self.histogram))
        {
            object.extend(quantiles);
        }
        if let Some(error) = &self.first_error {
            value["first_error"] = Value::from(error.as_str());
        }
        value
    }
}

/// Whether a failure (`"{status}: {body}"`) is Baton refusing the request while overloaded.
fn is_shed(error: &str) -> bool {
    error.starts_with("503") && error.contains("\"OVERLOADED\"")
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    // 1 us to 60 s at 3 significant figures; larger values saturate.
    Ok(Histogram::new_with_bounds(1, 60_000_000, 3)?)
}

fn record(histogram: &mut Histogram<u64>, latency: Duration) {
    let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
    histogram.saturating_record(micros.max(1));
}

pub fn quantiles(histogram: &Histogram<u64>) -> Value {
    if histogram.is_empty() {
        return json!({});
    }
    json!({
        "p50_us": histogram.value_at_quantile(0.50),
        "p90_us": histogram.value_at_quantile(0.90),
        "p99_us": histogram.value_at_quantile(0.99),
        "p999_us": histogram.value_at_quantile(0.999),
        "max_us": histogram.max(),
        "mean_us": histogram.mean().round(),
    })
}

/// One request read to its end; `Err` says what went wrong.
pub async fn send(client: &reqwest::Client, target: &Target) -> Result<(), String> {
    let response = target
        .post(client, &target.body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response.bytes().await.map_err(|e| e.to_string())?;
    answered(status, &body)
}

/// A response read to its end: `Err` with the status and the start of the body unless it
/// succeeded.
pub fn answered(status: http::StatusCode, body: &[u8]) -> Result<(), String> {
    if status.is_success() {
        Ok(())
    } else {
        Err(format!(
            "{status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        ))
    }
}

/// One request at a time on one keep-alive connection, for `duration` or `count` requests.
pub async fn sequential(
    target: &Target,
    duration: Option<Duration>,
    count: Option<u64>,
) -> anyhow::Result<Outcome> {
    let mut connection = Connection::new(target)?;
    let mut outcome = Outcome::new()?;
    let start = Instant::now();
    loop {
        if duration.is_some_and(|d| start.elapsed() >= d)
            || count.is_some_and(|c| outcome.sent >= c)
        {
            break;
        }
        let sent_at = Instant::now();
        let result = connection.send().await;
        outcome.record(sent_at.elapsed(), result);
    }
    outcome.elapsed = start.elapsed();
    Ok(outcome)
}

/// Open loop: requests start at fixed intended times whatever the server does, and latency is
/// measured from the intended time, so a stall shows as the queue it causes (no coordinated
/// omission). A plain thread paces the sends because it sleeps more precisely than tokio's
/// millisecond timer. `rps` is the rate achieved in sending.
pub async fn fixed_rate(
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
                let result = send(&client, &target).await;
                let _ = results.send((intended.elapsed(), result));
            });
        }
        start.elapsed()
    });
    let mut outcome = Outcome::new()?;
    while let Some((latency, result)) = received.recv().await {
        outcome.record(latency, result);
    }
    // A pacer that fell behind took longer than `duration`: the achieved rate shows it.
    outcome.elapsed = pacer
        .join()
        .map_err(|_| anyhow::anyhow!("the pacing thread failed"))?
        .max(duration);
    Ok(outcome)
}

/// Closed loop: `workers` requests in flight at all times for `duration`, each worker on a
/// keep-alive connection of its own.
pub async fn concurrent(
    target: &Target,
    workers: usize,
    duration: Duration,
) -> anyhow::Result<Outcome> {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let mut connection = Connection::new(target)?;
        tasks.spawn(async move {
            let mut results = Vec::new();
            while start.elapsed() < duration {
                let sent_at = Instant::now();
                let result = connection.send().await;
                results.push((sent_at.elapsed(), result));
            }
            results
        });
    }
    let mut outcome = Outcome::new()?;
    while let Some(results) = tasks.join_next().await {
        for (latency, result) in results.unwrap_or_default() {
            outcome.record(latency, result);
        }
    }
    outcome.elapsed = start.elapsed();
    Ok(outcome)
}

/// Time to the first content token (from the stream's start) and the gaps between content
/// chunks of a set of streams.
pub struct StreamOutcome {
    pub ttft: Outcome,
    pub gaps: Histogram<u64>,
}

impl StreamOutcome {
    fn new() -> anyhow::Result<StreamOutcome> {
        Ok(StreamOutcome {
            ttft: Outcome::new()?,
            gaps: histogram()?,
        })
    }

    fn add(&mut self, times: StreamTimes, start: Instant) {
        let result = match (&times.error, times.content.first()) {
            (Some(error), _) => Err(error.clone()),
            (None, None) => Err("no content chunk".to_string()),
            (None, Some(_)) if !times.done => Err("no [DONE]".to_string()),
            (None, Some(_)) => Ok(()),
        };
        let ttft = times.content.first().map_or(Duration::ZERO, |first| {
            first.saturating_duration_since(start)
        });
        if result.is_ok() {
            for pair in times.content.windows(2) {
                record(&mut self.gaps, pair[1].saturating_duration_since(pair[0]));
            }
        }
        self.ttft.record(ttft, result);
    }

    pub fn json(&self) -> Value {
        json!({"ttft": self.ttft.json(), "gap": quantiles(&self.gaps)})
    }
}

#[derive(Default)]
struct StreamTimes {
    /// Arrival of each chunk carrying content (several events in one read share a time).
    content: Vec<Instant>,
    done: bool,
    error: Option<String>,
}

/// Reads one streamed response, noting when each event with `choices[0].delta.content`
/// non-empty arrived (the role chunk and the usage chunk carry none).
async fn read_stream(
    client: &reqwest::Client,
    target: &Target,
    url: &str,
    body: &str,
) -> StreamTimes {
    let mut times = StreamTimes::default();
    let mut response = match target.post_to(client, url, body).send().await {
        Ok(response) if response.status().is_success() => response,
        Ok(response) => {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            times.error = Some(format!("{status}: {}", &text[..text.len().min(300)]));
            return times;
        }
        Err(error) => {
            times.error = Some(error.to_string());
            return times;
        }
    };
    let mut buffer = String::new();
    loop {
        match response.chunk().await {
            Ok(Some(bytes)) => {
                let now = Instant::now();
                buffer.push_str(&String::from_utf8_lossy(&bytes));
                while let Some(end) = buffer.find("\n\n") {
                    let event: String = buffer.drain(..end + 2).collect();
                    match event_kind(&event) {
                        Event::Content => times.content.push(now),
                        Event::Done => times.done = true,
                        Event::Other => {}
                    }
                }
            }
            Ok(None) => return times,
            Err(error) => {
                times.error = Some(error.to_string());
                return times;
            }
        }
    }
}

#[derive(Debug, PartialEq)]
enum Event {
    Content,
    Done,
    Other,
}

fn event_kind(event: &str) -> Event {
    for line in event.lines() {
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let data = data.trim();
        if data == "[DONE]" {
            return Event::Done;
        }
        // Cheap test first: most events of a stream are content chunks, all are JSON.
        if !data.contains("\"content\"") {
            continue;
        }
        let content = serde_json::from_str::<Value>(data)
            .ok()
            .and_then(|v| v["choices"][0]["delta"]["content"].as_str().map(str::len));
        if content.is_some_and(|len| len > 0) {
            return Event::Content;
        }
    }
    Event::Other
}

/// `count` streams one after another; TTFT from each stream's send.
pub async fn streams(
    client: &reqwest::Client,
    target: &Target,
    count: usize,
) -> anyhow::Result<StreamOutcome> {
    let mut outcome = StreamOutcome::new()?;
    for _ in 0..count {
        short_stream(client, target, &mut outcome).await;
    }
    Ok(outcome)
}

/// Reads one short stream from `target` into `outcome`, TTFT from its send; the phase's time
/// is the sum of its streams'.
async fn short_stream(client: &reqwest::Client, target: &Target, outcome: &mut StreamOutcome) {
    let sent_at = Instant::now();
    let times = read_stream(client, target, &target.url, &target.stream_body).await;
    outcome.add(times, sent_at);
    outcome.ttft.elapsed += sent_at.elapsed();
}

/// `count` streams through `gateway`, each right after one straight to `direct`: both sides'
/// tails come from the same seconds, so one noisy stretch cannot skew their difference.
/// Returns `(direct, gateway)`.
pub async fn paired_streams(
    client: &reqwest::Client,
    direct: &Target,
    gateway: &Target,
    count: usize,
) -> anyhow::Result<(StreamOutcome, StreamOutcome)> {
    let mut sides = [StreamOutcome::new()?, StreamOutcome::new()?];
    for _ in 0..count {
        for (target, outcome) in [direct, gateway].into_iter().zip(sides.iter_mut()) {
            short_stream(client, target, outcome).await;
        }
    }
    let [direct, gateway] = sides;
    Ok((direct, gateway))
}

/// `count` long streams opened at once; TTFT from the common start (all are meant to start
/// then, so a gateway slow to accept shows).
pub async fn concurrent_streams(
    client: &reqwest::Client,
    target: &Target,
    count: usize,
) -> anyhow::Result<StreamOutcome> {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..count {
        let (client, target) = (client.clone(), target.clone());
        tasks.spawn(async move {
            read_stream(&client, &target, &target.long_url, &target.long_stream_body).await
        });
    }
    let mut outcome = StreamOutcome::new()?;
    while let Some(times) = tasks.join_next().await {
        let times = times.unwrap_or_else(|e| StreamTimes {
            error: Some(e.to_string()),
            ..StreamTimes::default()
        });
        outcome.add(times, start);
    }
    outcome.ttft.elapsed = start.elapsed();
    Ok(outcome)
}

/// The rows of Baton's invocation log once its writer has caught up, or the rows read when
/// `timeout` has passed without that.
///
/// The log is written in batches and listed newest first, so a pass over it that starts while
/// the last batches are still being committed pages past them and comes out short (a full pass
/// over a few hundred thousand rows takes longer than any sensible timeout, so there would be no
/// second pass either). The writer's own count of committed runs (`/metrics`) is polled until
/// it reaches `expected`, or until the writer has been quiet for [`WRITER_QUIET`] (nothing
/// queued, the count unchanged: the rows will not reach `expected`, and reading says how many
/// there are); then the log is read once, in full.
pub async fn wait_for_log_rows(
    client: &reqwest::Client,
    baton_addr: &str,
    key: &str,
    expected: u64,
    timeout: Duration,
) -> anyhow::Result<u64> {
    let deadline = Instant::now() + timeout;
    let mut last = None;
    let mut unchanged_since = Instant::now();
    loop {
        let metrics = metrics_text(client, baton_addr).await?;
        let written = runs_total(&metrics);
        let now = Instant::now();
        if last != Some(written) {
            last = Some(written);
            unchanged_since = now;
        }
        let quiet = LaneBatches::parse(&metrics).queued == 0
            && now.duration_since(unchanged_since) >= WRITER_QUIET;
        if written >= expected || quiet || now >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    count_log_rows(client, baton_addr, key).await
}

/// How long the log writer must have had nothing queued and committed nothing before
/// [`wait_for_log_rows`] stops waiting for rows: far longer than a batch takes to commit.
const WRITER_QUIET: Duration = Duration::from_secs(5);

async fn metrics_text(client: &reqwest::Client, baton_addr: &str) -> anyhow::Result<String> {
    Ok(client
        .get(format!("http://{baton_addr}/metrics"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?)
}

/// Runs the log writer has committed so far: the sum of every `baton_runs_total{...}` series
/// in a `/metrics` text.
fn runs_total(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("baton_runs_total")?;
            // Not another series whose name starts so (`baton_runs_total_created`, say).
            if !rest.starts_with(['{', ' ']) {
                return None;
            }
            // Past the labels (a value never holds a brace).
            let value = rest.rsplit_once('}').map_or(rest, |(_, value)| value);
            value.trim().parse::<f64>().ok()
        })
        .map(|value| value as u64)
        .sum()
}

async fn count_log_rows(
    client: &reqwest::Client,
    baton_addr: &str,
    key: &str,
) -> anyhow::Result<u64> {
    Ok(log_rows(client, baton_addr, key).await?.len() as u64)
}

/// The log writer's batches so far and its queue, from Baton's `/metrics`.
pub async fn writer_batches(
    client: &reqwest::Client,
    baton_addr: &str,
) -> anyhow::Result<LaneBatches> {
    Ok(LaneBatches::parse(&metrics_text(client, baton_addr).await?))
}

/// The log writer's batch counters from Baton's `/metrics`: batches written on the idle lane,
/// on the writer's own runtime, and idle-lane batches starved of CPU; and the runs still
/// queued for it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LaneBatches {
    pub idle: u64,
    pub own: u64,
    pub starved: u64,
    pub queued: u64,
}

impl LaneBatches {
    fn parse(metrics: &str) -> LaneBatches {
        let counter = |name: &str| {
            metrics
                .lines()
                .find_map(|line| line.strip_prefix(name)?.trim().parse::<f64>().ok())
                .map_or(0, |value| value as u64)
        };
        LaneBatches {
            idle: counter(r#"baton_log_writer_batches_total{lane="idle"}"#),
            own: counter(r#"baton_log_writer_batches_total{lane="own"}"#),
            starved: counter("baton_log_writer_starved_batches_total"),
            queued: counter("baton_log_writer_queue_depth"),
        }
    }

    /// The batches counted since `before`.
    pub fn since(self, before: LaneBatches) -> LaneBatches {
        LaneBatches {
            idle: self.idle.saturating_sub(before.idle),
            own: self.own.saturating_sub(before.own),
            starved: self.starved.saturating_sub(before.starved),
            queued: self.queued,
        }
    }
}

/// One JSON call to Baton's API with `key`: the answer's body, or an error naming `what` was
/// being done, the path, the status and the body.
pub async fn api_call(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    what: &str,
    method: reqwest::Method,
    path: String,
    body: Value,
) -> anyhow::Result<Value> {
    let response = client
        .request(method, format!("{base}{path}"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    ensure!(status.is_success(), "{what} {path}: {status}: {body}");
    Ok(body)
}

/// Creates the environment `name` unless the tenant behind `key` has it already.
pub async fn ensure_environment(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    name: &str,
) -> anyhow::Result<()> {
    use reqwest::Method;
    let call = |method, path: &str, body| {
        api_call(
            client,
            base,
            key,
            "setting up",
            method,
            path.to_string(),
            body,
        )
    };
    let environments = call(Method::GET, "/environments", Value::Null).await?;
    let present = environments
        .as_array()
        .is_some_and(|all| all.iter().any(|e| e["name"] == name));
    if !present {
        call(Method::POST, "/environments", json!({ "name": name })).await?;
    }
    Ok(())
}

/// A new flow titled `title` whose first version's `main` template is `template`, that version
/// pinned to `environment`: the flow's name (the slug runs are addressed by).
pub async fn pinned_flow(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    title: &str,
    template: Value,
    environment: &str,
) -> anyhow::Result<String> {
    use reqwest::Method;
    let call =
        |method, path: String, body| api_call(client, base, key, "setting up", method, path, body);
    let flow = call(Method::POST, "/flows".into(), json!({ "title": title })).await?;
    let slug = flow["name"].as_str().context("flow name")?.to_string();
    let versions = call(Method::GET, format!("/flows/{slug}/versions"), Value::Null).await?;
    let version = versions[0]["id"]
        .as_str()
        .context("version id")?
        .to_string();
    call(
        Method::PUT,
        format!("/flows/{slug}/versions/{version}/templates/main"),
        template,
    )
    .await?;
    call(
        Method::POST,
        format!("/flows/{slug}/versions/{version}/environments"),
        json!({ "environment": environment }),
    )
    .await?;
    Ok(slug)
}

/// A new Agent tool named `name` that runs the flow `flow`: its id.
pub async fn agent_tool(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    name: &str,
    flow: &str,
) -> anyhow::Result<Value> {
    let tool = api_call(
        client,
        base,
        key,
        "setting up",
        reqwest::Method::POST,
        "/tools".into(),
        json!({"name": name, "toolType": "Agent", "agentTemplateId": flow,
               "description": format!("Ask the {name}")}),
    )
    .await?;
    Ok(tool["id"].clone())
}

/// Every row of Baton's invocation log (child runs included, as the API lists them), paged
/// through `/api/v1/llm-logs`.
pub async fn log_rows(
    client: &reqwest::Client,
    baton_addr: &str,
    key: &str,
) -> anyhow::Result<Vec<Value>> {
    let url = format!("http://{baton_addr}/api/v1/llm-logs");
    let mut rows = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut query = vec![("pageSize", "200".to_string())];
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor.clone()));
        }
        let response = client
            .get(&url)
            .bearer_auth(key)
            .query(&query)
            .send()
            .await?;
        let status = response.status();
        let page: Value = response.json().await?;
        ensure!(status.is_success(), "GET /api/v1/llm-logs: {status} {page}");
        rows.extend(page["items"].as_array().cloned().unwrap_or_default());
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return Ok(rows),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_batches_are_read_from_the_metrics_text() {
        let text = "# TYPE baton_log_writer_batches counter\n\
            baton_log_writer_batches_total{lane=\"idle\"} 12\n\
            baton_log_writer_batches_total{lane=\"own\"} 3\n\
            baton_log_writer_starved_batches_total 1\n\
            # HELP baton_log_writer_queue_depth Runs waiting for the log writer.\n\
            baton_log_writer_queue_depth 40\n";
        let counted = LaneBatches::parse(text);
        assert_eq!(
            counted,
            LaneBatches {
                idle: 12,
                own: 3,
                starved: 1,
                queued: 40,
            }
        );
        // A lane never used has no line yet.
        assert_eq!(
            LaneBatches::parse("baton_log_writer_starved_batches_total 0\n"),
            LaneBatches::default()
        );
        let before = LaneBatches {
            idle: 10,
            own: 3,
            starved: 0,
            queued: 7,
        };
        assert_eq!(
            counted.since(before),
            LaneBatches {
                idle: 2,
                own: 0,
                starved: 1,
                queued: 40,
            }
        );
    }

    #[test]
    fn written_runs_sum_every_kind_and_status() {
        let text = "# HELP baton_runs Runs written to the invocation log, by kind and status.\n\
            # TYPE baton_runs counter\n\
            baton_runs_total{kind=\"chat\",status=\"Success\"} 370000\n\
            baton_runs_total{kind=\"chat\",status=\"Error\"} 12\n\
            baton_runs_total_created{kind=\"chat\",status=\"Success\"} 1790000000.5\n\
            baton_run_duration_seconds_sum{model=\"m\"} 3.5\n\
            baton_log_writer_queue_depth 0\n";
        assert_eq!(runs_total(text), 370_012);
        assert_eq!(runs_total("baton_log_writer_queue_depth 0\n"), 0);
    }

    #[test]
    fn only_chunks_with_content_count() {
        let role = r#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
        let token = r#"data: {"choices":[{"index":0,"delta":{"content":"tok "}}]}"#;
        let usage = r#"data: {"choices":[],"usage":{"prompt_tokens":1}}"#;
        let baton = "id: 3\ndata: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}";
        assert_eq!(event_kind(role), Event::Other);
        assert_eq!(event_kind(token), Event::Content);
        assert_eq!(event_kind(usage), Event::Other);
        assert_eq!(event_kind(baton), Event::Content);
        assert_eq!(event_kind("data: [DONE]"), Event::Done);
        assert_eq!(event_kind(": keep-alive"), Event::Other);
    }

    #[test]
    fn gaps_and_ttft_come_from_content_arrivals() {
        let mut outcome = StreamOutcome::new().unwrap();
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        outcome.add(
            StreamTimes {
                content: vec![at(5), at(8), at(12)],
                done: true,
                error: None,
            },
            start,
        );
        outcome.add(
            StreamTimes {
                content: vec![at(1)],
                done: false,
                error: None,
            },
            start,
        );
        assert_eq!((outcome.ttft.sent, outcome.ttft.errors), (2, 1));
        assert_eq!(outcome.ttft.histogram.len(), 1);
        assert!((4_990..=5_010).contains(&outcome.ttft.quantile(0.5)));
        assert_eq!(outcome.gaps.len(), 2);
        assert!((3_990..=4_010).contains(&outcome.gaps.max()));
    }
}
