//! The scenarios, run once directly against the mock (the baseline) and then through each
//! gateway, each gateway figure next to the direct one it is compared with.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::driver::{self, Outcome, StreamOutcome, Target};
use super::flows::FlowTargets;
use super::options::{Gateway, Options};
use super::procs::{self, RssSampler};

/// Requests of each gateway's warm-up, before anything is measured.
const WARM_UP: u64 = 200;
/// Runs of each flow kind's warm-up (an agent tree is three model calls).
const FLOW_WARM_UP: u64 = 50;
/// Skip a fixed rate above this multiple of a gateway's closed-loop throughput: it would only
/// measure a queue growing for the whole phase (LiteLLM at 5,000 RPS).
const OVERLOAD_FACTOR: f64 = 3.0;
/// A sweep step passes under this added p99 and error rate.
pub const SWEEP_MAX_ADDED_P99_US: i64 = 1_000;
pub const SWEEP_MAX_ERROR_RATE: f64 = 0.001;
/// How long the invocation log may take to catch up after the load stops.
const LOG_DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Context {
    pub options: Options,
    pub client: reqwest::Client,
    pub clock_ticks: u64,
    pub direct: Target,
    pub baseline: Baseline,
    /// The `baton` binary the Baton gateways run (`--pgo`: the profile-guided one).
    pub baton: PathBuf,
    /// The mock's process, whose CPU in a gateway's closed loop shows how far it was from
    /// being the bottleneck.
    pub mock_pid: u32,
}

/// The direct figures: fixed rates (and sweep steps) are measured on first use and kept.
pub struct Baseline {
    pub c1: Outcome,
    pub conc: Outcome,
    /// What the mock serves with its threads all busy, read in the direct closed loop (its
    /// throughput over its busy share): the capacity a gateway's throughput is held against.
    /// `None` when its CPU could not be read.
    mock_capacity_rps: Option<f64>,
    /// The mock's busy share of its threads in the direct closed loop.
    mock_cpu_share: Option<f64>,
    mock_threads: usize,
    pub streams: StreamOutcome,
    pub many: StreamOutcome,
    rates: BTreeMap<(u64, u64), Outcome>,
}

pub fn progress(path: &str, message: &str) {
    eprintln!("bench: [{path}] {message}");
}

fn summary(outcome: &Outcome) -> String {
    format!(
        "{} requests, {:.0} RPS, p50 {} us, p99 {} us, {} errors ({} shed){}",
        outcome.sent,
        outcome.rps(),
        outcome.quantile(0.5),
        outcome.quantile(0.99),
        outcome.errors,
        outcome.shed,
        outcome
            .first_error
            .as_deref()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default()
    )
}

impl Baseline {
    pub async fn measure(
        options: &Options,
        client: &reqwest::Client,
        direct: &Target,
        mock_pid: u32,
    ) -> anyhow::Result<Baseline> {
        progress("direct", "warm-up");
        driver::sequential(direct, None, Some(WARM_UP)).await?;
        let c1 = driver::sequential(direct, Some(options.duration), None).await?;
        progress("direct", &format!("concurrency 1: {}", summary(&c1)));
        let mock_cpu = CpuMeter::start(mock_pid, procs::clock_ticks_per_second());
        let conc = driver::concurrent(direct, options.concurrency, options.duration).await?;
        let mock_threads = options.mock_threads.unwrap_or(1);
        let mock_cpu_share = mock_cpu.thread_share(mock_threads);
        let mock_capacity_rps = mock_capacity(conc.rps(), mock_cpu_share);
        progress(
            "direct",
            &format!(
                "concurrency {}: {}{}",
                options.concurrency,
                summary(&conc),
                match (mock_cpu_share, mock_capacity_rps) {
                    (Some(share), Some(capacity)) => format!(
                        "; mock busy {:.0}% of its {mock_threads} thread(s): capacity {capacity:.0} RPS",
                        share * 100.0
                    ),
                    _ => String::new(),
                }
            ),
        );
        let streams = driver::streams(client, direct, options.streams).await?;
        progress(
            "direct",
            &format!(
                "{} streams: TTFT {}",
                options.streams,
                summary(&streams.ttft)
            ),
        );
        let many = driver::concurrent_streams(client, direct, options.concurrent_streams).await?;
        progress(
            "direct",
            &format!(
                "{} concurrent streams: TTFT {}",
                options.concurrent_streams,
                summary(&many.ttft)
            ),
        );
        Ok(Baseline {
            c1,
            conc,
            mock_capacity_rps,
            mock_cpu_share,
            mock_threads,
            streams,
            many,
            rates: BTreeMap::new(),
        })
    }

    async fn at_rate(
        &mut self,
        client: &reqwest::Client,
        direct: &Target,
        rate: u64,
        duration: Duration,
    ) -> anyhow::Result<&Outcome> {
        let key = (rate, duration.as_millis() as u64);
        if let std::collections::btree_map::Entry::Vacant(entry) = self.rates.entry(key) {
            let outcome = driver::fixed_rate(client, direct, rate as f64, duration).await?;
            progress("direct", &format!("{rate} RPS: {}", summary(&outcome)));
            entry.insert(outcome);
        }
        self.rates
            .get(&key)
            .ok_or_else(|| anyhow::anyhow!("direct rate {rate} not measured"))
    }

    pub fn json(&self) -> Value {
        let rates: Vec<Value> = self
            .rates
            .iter()
            .map(|((rate, ms), outcome)| json!({"rate": rate, "duration_ms": ms, "direct": outcome.json()}))
            .collect();
        json!({
            "concurrency_1": self.c1.json(),
            "concurrency": self.conc.json(),
            "mock_cpu_share": self.mock_cpu_share.map(|share| (share * 1000.0).round() / 1000.0),
            "mock_capacity_rps": self.mock_capacity_rps.map(f64::round),
            "mock_threads": self.mock_threads,
            "streams": self.streams.json(),
            "concurrent_streams": self.many.json(),
            "rates": rates,
        })
    }
}

/// Gateway minus direct at one quantile (signed: noise can make it negative).
fn added(gateway: &Outcome, direct: &Outcome, q: f64) -> i64 {
    if gateway.histogram.is_empty() || direct.histogram.is_empty() {
        return i64::MAX;
    }
    i64::try_from(gateway.quantile(q)).unwrap_or(i64::MAX)
        - i64::try_from(direct.quantile(q)).unwrap_or(i64::MAX)
}

fn added_q(
    gateway: &hdrhistogram::Histogram<u64>,
    direct: &hdrhistogram::Histogram<u64>,
    q: f64,
) -> Value {
    if gateway.is_empty() || direct.is_empty() {
        return Value::Null;
    }
    Value::from(gateway.value_at_quantile(q) as i64 - direct.value_at_quantile(q) as i64)
}

/// CPU time of a process tree over one phase: per request sent, or as a share of one core.
struct CpuMeter {
    pid: u32,
    ticks_per_second: u64,
    before: u64,
    started: Instant,
}

impl CpuMeter {
    fn start(pid: u32, ticks_per_second: u64) -> CpuMeter {
        CpuMeter {
            pid,
            ticks_per_second,
            before: procs::cpu_ticks(pid),
            started: Instant::now(),
        }
    }

    fn per_request(self, requests: u64) -> i64 {
        let ticks = procs::cpu_ticks(self.pid).saturating_sub(self.before);
        micros_per_request(ticks, self.ticks_per_second, requests)
    }

    /// CPU time over wall time since the start, spread over `threads` (the busy share of a
    /// process serving on that many threads, each able to keep a core busy); `None` when no
    /// time passed or the process could not be read.
    fn thread_share(self, threads: usize) -> Option<f64> {
        let elapsed = self.started.elapsed().as_secs_f64() * threads.max(1) as f64;
        let ticks = procs::cpu_ticks(self.pid).checked_sub(self.before)?;
        (elapsed > 0.0).then(|| ticks as f64 / self.ticks_per_second.max(1) as f64 / elapsed)
    }
}

/// What the mock serves with every thread busy: `rps` over the share of its threads it was
/// busy. The direct closed loop shares two vCPUs with the driver, so its throughput alone
/// bounds the driver as much as the mock, and falls as the gateway gets cheaper; each of the
/// mock's threads serves its own connections on a runtime of its own (nothing shared between
/// them), so throughput over busy share is what its threads can do. `None` when the share was
/// not read or too small to divide by.
fn mock_capacity(rps: f64, share: Option<f64>) -> Option<f64> {
    share
        .filter(|share| *share >= 0.01)
        .map(|share| rps / share.min(1.0))
}

/// `ticks` of CPU (at `ticks_per_second`) spread over `requests`, in whole microseconds.
fn micros_per_request(ticks: u64, ticks_per_second: u64, requests: u64) -> i64 {
    let micros = ticks as f64 * 1e6 / ticks_per_second.max(1) as f64;
    (micros / requests.max(1) as f64).round() as i64
}

/// CPU time of the PostgreSQL server processes serving a gateway's database over one phase,
/// per request: the part of logging that a SQLite gateway does in its own process (and its
/// CPU figure counts) and a PostgreSQL gateway hands to the database server. Read once the log
/// writer has no run queued after the phase (what is in flight then, at most a batch, is left
/// out).
struct DatabaseMeter<'a> {
    database: &'a procs::PgDatabase,
    ticks_per_second: u64,
    before: HashMap<u32, u64>,
}

impl<'a> DatabaseMeter<'a> {
    fn start(database: Option<&'a procs::PgDatabase>, ticks_per_second: u64) -> Option<Self> {
        database.map(|database| DatabaseMeter {
            database,
            ticks_per_second,
            before: database.backend_ticks(),
        })
    }

    /// Microseconds per request, `null` for a gateway without a database or when the server's
    /// processes could not be read.
    async fn finish(meter: Option<Self>, lanes: &LaneMeter<'_>, requests: u64) -> Value {
        let Some(meter) = meter else {
            return Value::Null;
        };
        lanes.wait_for_empty_queue().await;
        let after = meter.database.backend_ticks();
        if after.is_empty() {
            return Value::Null;
        }
        let ticks: u64 = after
            .iter()
            .map(|(pid, ticks)| ticks.saturating_sub(meter.before.get(pid).copied().unwrap_or(0)))
            .sum();
        Value::from(micros_per_request(ticks, meter.ticks_per_second, requests))
    }
}

/// Longest a phase waits for the log writer to drain what the phases before it queued.
const DRAIN_WAIT: Duration = Duration::from_secs(30);

/// The log writer's batches by lane over one phase (Baton only: read from `/metrics`), to see
/// whether the idle lane kept up or was starved.
struct LaneMeter<'a> {
    client: &'a reqwest::Client,
    baton_addr: Option<&'a str>,
    before: driver::LaneBatches,
    /// How long the phase's start waited for the writer's queue to empty.
    drained: Duration,
}

impl<'a> LaneMeter<'a> {
    /// Waits (up to [`DRAIN_WAIT`]) until the log writer has no run queued, so a phase measures
    /// its own load, not the backlog a saturating phase before it left (which the writer
    /// catches up on at normal priority), then reads the counters.
    async fn start(client: &'a reqwest::Client, baton_addr: Option<&'a str>) -> LaneMeter<'a> {
        let waiting = Instant::now();
        let before = drained(client, baton_addr).await;
        LaneMeter {
            client,
            baton_addr,
            before,
            drained: waiting.elapsed(),
        }
    }

    /// Returns once the log writer has no run queued (or after [`DRAIN_WAIT`]).
    async fn wait_for_empty_queue(&self) {
        drained(self.client, self.baton_addr).await;
    }

    /// `{"idle", "own", "starved", "drain_wait_ms"}` batches since the start (`null` for a peer
    /// or when `/metrics` could not be read).
    async fn finish(self) -> Value {
        let Some(addr) = self.baton_addr else {
            return Value::Null;
        };
        let Ok(after) = driver::writer_batches(self.client, addr).await else {
            return Value::Null;
        };
        let batches = after.since(self.before);
        json!({"idle": batches.idle, "own": batches.own, "starved": batches.starved,
               "drain_wait_ms": self.drained.as_millis() as u64})
    }
}

/// The writer's counters once it has no run queued (or after [`DRAIN_WAIT`]); zeros for a
/// peer.
async fn drained(client: &reqwest::Client, baton_addr: Option<&str>) -> driver::LaneBatches {
    let Some(addr) = baton_addr else {
        return driver::LaneBatches::default();
    };
    let waiting = Instant::now();
    loop {
        let batches = driver::writer_batches(client, addr)
            .await
            .unwrap_or_default();
        if batches.queued == 0 || waiting.elapsed() >= DRAIN_WAIT {
            return batches;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `; log batches idle N / own N (N starved)` for a progress line, when there were batches.
fn lanes_note(batches: &Value) -> String {
    match (batches["idle"].as_u64(), batches["own"].as_u64()) {
        (Some(idle), Some(own)) if idle + own > 0 => format!(
            "; log batches idle {idle} / own {own} ({} starved)",
            batches["starved"].as_u64().unwrap_or(0)
        ),
        _ => String::new(),
    }
}

/// What a gateway's phases are measured with: its process, and where its log writer's counters
/// and database server are read.
#[derive(Clone, Copy)]
struct Probe<'a> {
    client: &'a reqwest::Client,
    pid: u32,
    ticks_per_second: u64,
    /// Baton's address (its `/metrics`); `None` for a peer.
    baton_addr: Option<&'a str>,
    /// A PostgreSQL gateway's database, whose server processes' CPU is counted too.
    database: Option<&'a procs::PgDatabase>,
}

impl<'a> Probe<'a> {
    /// Starts a measured phase's meters once the log writer's queue is empty (so the phase
    /// measures its own load, not a backlog the phases before it left).
    async fn start(self) -> PhaseMeters<'a> {
        let lanes = LaneMeter::start(self.client, self.baton_addr).await;
        PhaseMeters {
            lanes,
            cpu: CpuMeter::start(self.pid, self.ticks_per_second),
            database: DatabaseMeter::start(self.database, self.ticks_per_second),
        }
    }
}

/// The meters of one measured phase, read by [`PhaseMeters::finish`] right after its load.
struct PhaseMeters<'a> {
    lanes: LaneMeter<'a>,
    cpu: CpuMeter,
    database: Option<DatabaseMeter<'a>>,
}

/// What one phase cost, per request sent.
struct PhaseCost {
    cpu_us: i64,
    /// The database server's CPU (`null` without one).
    database_cpu_us: Value,
    /// The log writer's batches by lane (`null` for a peer).
    batches: Value,
}

impl PhaseMeters<'_> {
    /// Reads the gateway's CPU at once, then the database server's and the writer's batches
    /// once the writer has written what the phase queued.
    async fn finish(self, requests: u64) -> PhaseCost {
        let cpu_us = self.cpu.per_request(requests);
        let database_cpu_us = DatabaseMeter::finish(self.database, &self.lanes, requests).await;
        let batches = self.lanes.finish().await;
        PhaseCost {
            cpu_us,
            database_cpu_us,
            batches,
        }
    }
}

/// Counts what a gateway was sent, for the log-row check.
#[derive(Default)]
struct Sent {
    requests: u64,
    errors: u64,
    shed: u64,
    /// Log rows the requests should leave: one a run, none for a shed request.
    rows: u64,
}

impl Sent {
    /// Requests that each make one run (chat completions, plain flow runs).
    fn add(&mut self, outcome: &Outcome) {
        self.add_runs(outcome, 1);
    }

    /// Requests that each make `runs` runs (an agent tree: its root and its sub-agents).
    fn add_runs(&mut self, outcome: &Outcome, runs: u64) {
        self.requests += outcome.sent;
        self.errors += outcome.errors;
        self.shed += outcome.shed;
        self.rows += (outcome.sent - outcome.shed) * runs;
    }
}

/// Flow runs through a Baton gateway: a plain flow (one model call, as a chat completion is)
/// and an agent tree (three model calls, two runs), each one at a time and in the closed loop.
/// Chat completions are only part of what a gateway serves: these time the flow-run path
/// (template rendering, the pinned version, the tool loop) the instruction counts cover.
async fn flow_phases(
    ctx: &Context,
    name: &str,
    flows: &FlowTargets,
    probe: Probe<'_>,
    sent: &mut Sent,
) -> anyhow::Result<Value> {
    let options = &ctx.options;
    let mut phases = serde_json::Map::new();
    for (kind, target, runs) in [
        ("flow_run", &flows.plain, FlowTargets::PLAIN_ROWS),
        (
            "agent_tree",
            &flows.agent_tree,
            FlowTargets::AGENT_TREE_ROWS,
        ),
    ] {
        let label = kind.replace('_', " ");
        let warm = driver::sequential(target, None, Some(FLOW_WARM_UP)).await?;
        sent.add_runs(&warm, runs);

        let meters = probe.start().await;
        let c1 = driver::sequential(target, Some(options.duration), None).await?;
        let c1_cost = meters.finish(c1.sent).await;
        sent.add_runs(&c1, runs);
        progress(
            name,
            &format!(
                "{label}, concurrency 1: {}{}",
                summary(&c1),
                lanes_note(&c1_cost.batches)
            ),
        );

        let meters = probe.start().await;
        let conc = driver::concurrent(target, options.concurrency, options.duration).await?;
        let conc_cost = meters.finish(conc.sent).await;
        sent.add_runs(&conc, runs);
        progress(
            name,
            &format!(
                "{label}, concurrency {}: {}{}",
                options.concurrency,
                summary(&conc),
                lanes_note(&conc_cost.batches)
            ),
        );
        phases.insert(
            kind.into(),
            json!({
                "runs_logged_each": runs,
                "concurrency_1": {
                    "gateway": c1.json(),
                    // Against one direct call: a plain flow run makes one, an agent tree three.
                    "added_p50_us": added(&c1, &ctx.baseline.c1, 0.50),
                    "added_p99_us": added(&c1, &ctx.baseline.c1, 0.99),
                    "cpu_us_per_request": c1_cost.cpu_us,
                    "database_cpu_us_per_request": c1_cost.database_cpu_us,
                    "log_batches": c1_cost.batches,
                },
                "concurrency": {
                    "concurrency": options.concurrency,
                    "gateway": conc.json(),
                    "rps": (conc.rps() * 10.0).round() / 10.0,
                    "cpu_us_per_request": conc_cost.cpu_us,
                    "database_cpu_us_per_request": conc_cost.database_cpu_us,
                    "log_batches": conc_cost.batches,
                },
            }),
        );
    }
    Ok(Value::Object(phases))
}

/// Every scenario through one gateway (already started, serving `target`, process `pid`).
pub async fn run_gateway(
    ctx: &mut Context,
    gateway: Gateway,
    target: &Target,
    pid: u32,
    baton_addr: Option<&str>,
    flows: Option<&FlowTargets>,
    database: Option<&procs::PgDatabase>,
) -> anyhow::Result<Value> {
    let name = gateway.name();
    let options = ctx.options.clone();
    let client = ctx.client.clone();
    let ticks = ctx.clock_ticks;
    let probe = Probe {
        client: &client,
        pid,
        ticks_per_second: ticks,
        baton_addr,
        database,
    };
    let mut sent = Sent::default();
    let mut cpu = serde_json::Map::new();

    let rss_idle = procs::rss_kb(pid);
    let sampler = RssSampler::start(pid);
    progress(
        name,
        &format!("idle RSS {:.1} MB; warm-up", rss_idle as f64 / 1024.0),
    );
    let warm = driver::sequential(target, None, Some(WARM_UP)).await?;
    sent.add(&warm);
    let warm_streams = driver::streams(&client, target, 3).await?;
    sent.add(&warm_streams.ttft);

    let meters = probe.start().await;
    let c1 = driver::sequential(target, Some(options.duration), None).await?;
    let c1_cost = meters.finish(c1.sent).await;
    sent.add(&c1);
    cpu.insert("concurrency_1".into(), c1_cost.cpu_us.into());
    progress(
        name,
        &format!(
            "concurrency 1: {}{}",
            summary(&c1),
            lanes_note(&c1_cost.batches)
        ),
    );
    let c1_json = json!({
        "gateway": c1.json(),
        "added_p50_us": added(&c1, &ctx.baseline.c1, 0.50),
        "added_p99_us": added(&c1, &ctx.baseline.c1, 0.99),
        "cpu_us_per_request": c1_cost.cpu_us,
        "database_cpu_us_per_request": c1_cost.database_cpu_us,
        "log_batches": c1_cost.batches,
    });

    let meters = probe.start().await;
    let mock_cpu = CpuMeter::start(ctx.mock_pid, ticks);
    let conc = driver::concurrent(target, options.concurrency, options.duration).await?;
    let mock_share = mock_cpu.thread_share(ctx.baseline.mock_threads);
    let conc_cost = meters.finish(conc.sent).await;
    sent.add(&conc);
    cpu.insert(
        format!("concurrency_{}", options.concurrency),
        conc_cost.cpu_us.into(),
    );
    progress(
        name,
        &format!(
            "concurrency {}: {}{}",
            options.concurrency,
            summary(&conc),
            lanes_note(&conc_cost.batches)
        ),
    );
    let gateway_rps = conc.rps().max(f64::MIN_POSITIVE);
    let direct_ratio = ctx.baseline.conc.rps() / gateway_rps;
    // Against the mock's capacity where its CPU was read, else the direct throughput (a lower
    // bound of the capacity).
    let headroom = ctx
        .baseline
        .mock_capacity_rps
        .map_or(direct_ratio, |capacity| capacity / gateway_rps);
    let conc_json = json!({
        "concurrency": options.concurrency,
        "gateway": conc.json(),
        "rps": (conc.rps() * 10.0).round() / 10.0,
        "mock_headroom": (headroom * 10.0).round() / 10.0,
        "mock_headroom_ok": headroom >= 5.0,
        "direct_throughput_ratio": (direct_ratio * 10.0).round() / 10.0,
        // The mock's busy share of its threads while this gateway was measured.
        "mock_cpu_share": mock_share.map(|share| (share * 1000.0).round() / 1000.0),
        "cpu_us_per_request": conc_cost.cpu_us,
        "database_cpu_us_per_request": conc_cost.database_cpu_us,
        "log_batches": conc_cost.batches,
    });
    if headroom < 5.0 {
        progress(
            name,
            &format!("mock headroom insufficient: {headroom:.1}x (needs 5x)"),
        );
    }

    let mut fixed = Vec::new();
    for &rate in &options.rates {
        if rate as f64 > OVERLOAD_FACTOR * conc.rps() {
            let reason = format!(
                "skipped: {rate} RPS is over {OVERLOAD_FACTOR}x its closed-loop throughput ({:.0} RPS)",
                conc.rps()
            );
            progress(name, &format!("{rate} RPS {reason}"));
            fixed.push(json!({"rate": rate, "skipped": reason}));
            continue;
        }
        let direct = ctx
            .baseline
            .at_rate(&client, &ctx.direct, rate, options.duration)
            .await?;
        let meters = probe.start().await;
        let outcome = driver::fixed_rate(&client, target, rate as f64, options.duration).await?;
        let cost = meters.finish(outcome.sent).await;
        sent.add(&outcome);
        cpu.insert(format!("fixed_{rate}"), cost.cpu_us.into());
        progress(
            name,
            &format!(
                "{rate} RPS: {}{}",
                summary(&outcome),
                lanes_note(&cost.batches)
            ),
        );
        fixed.push(json!({
            "rate": rate,
            "gateway": outcome.json(),
            "added_p50_us": added(&outcome, direct, 0.50),
            "added_p99_us": added(&outcome, direct, 0.99),
            "cpu_us_per_request": cost.cpu_us,
            "database_cpu_us_per_request": cost.database_cpu_us,
            "log_batches": cost.batches,
        }));
    }

    let flows_json = match flows {
        Some(flows) => flow_phases(ctx, name, flows, probe, &mut sent).await?,
        None => Value::Null,
    };

    let (base, streams) =
        driver::paired_streams(&client, &ctx.direct, target, options.streams).await?;
    sent.add(&streams.ttft);
    progress(
        name,
        &format!(
            "{} streams: TTFT {}",
            options.streams,
            summary(&streams.ttft)
        ),
    );
    let base = &base;
    let streams_json = json!({
        "count": options.streams,
        "shape": format!("{} chunks {} ms apart", procs::SHORT_CHUNKS, procs::SHORT_GAP_MS),
        "gateway": streams.json(),
        // The direct streams interleaved with these, one for one: what "added" is against.
        "direct": base.json(),
        "added_ttft_p50_us": added(&streams.ttft, &base.ttft, 0.50),
        "added_ttft_p99_us": added(&streams.ttft, &base.ttft, 0.99),
        "added_gap_p50_us": added_q(&streams.gaps, &base.gaps, 0.50),
        "added_gap_p99_us": added_q(&streams.gaps, &base.gaps, 0.99),
    });
    let rss_load = sampler.take_peak(pid);

    let started = Instant::now();
    let meter = CpuMeter::start(pid, ticks);
    let many = driver::concurrent_streams(&client, target, options.concurrent_streams).await?;
    let many_cpu = meter.per_request(many.ttft.sent);
    let rss_streams = sampler.take_peak(pid);
    sent.add(&many.ttft);
    cpu.insert("concurrent_streams".into(), many_cpu.into());
    progress(
        name,
        &format!(
            "{} concurrent streams in {:.1} s: TTFT {}; peak RSS {:.1} MB",
            options.concurrent_streams,
            started.elapsed().as_secs_f64(),
            summary(&many.ttft),
            rss_streams as f64 / 1024.0
        ),
    );
    let base = &ctx.baseline.many;
    let many_json = json!({
        "count": options.concurrent_streams,
        "shape": format!("{} chunks {} ms apart", procs::LONG_CHUNKS, procs::LONG_GAP_MS),
        "succeeded": many.ttft.sent - many.ttft.errors,
        "gateway": many.json(),
        "added_ttft_p99_us": added(&many.ttft, &base.ttft, 0.99),
        "peak_rss_kb": rss_streams,
        "cpu_us_per_request": many_cpu,
    });

    // Last of the load phases: its failing step overloads the gateway on purpose, and what
    // that leaves behind (memory jemalloc returns over its decay time, queued log runs)
    // must not weigh on the streams' figures.
    let mut steps = Vec::new();
    let mut highest: Option<u64> = None;
    // A failing step is run once more before the sweep ends: at a rate the gateway cannot
    // hold the retry fails too, while a single stall of the VM (a 3 s step's p99 is its ~8th
    // worst request at 250 RPS) does not end the sweep at a rate far below what the gateway's
    // fixed-rate phases held. Requests past capacity: both attempts at the rate that ended
    // the sweep; their errors are load shedding doing its job.
    let mut past_capacity = Sent::default();
    for &rate in &options.sweep {
        let mut attempt = 1;
        // The attempts' outcomes at this rate: past capacity if the rate ends the sweep.
        let mut at_rate = Sent::default();
        let passed = loop {
            let direct = ctx
                .baseline
                .at_rate(&client, &ctx.direct, rate, options.sweep_duration)
                .await?;
            let meters = probe.start().await;
            let outcome =
                driver::fixed_rate(&client, target, rate as f64, options.sweep_duration).await?;
            let cost = meters.finish(outcome.sent).await;
            sent.add(&outcome);
            at_rate.add(&outcome);
            let added_p99 = added(&outcome, direct, 0.99);
            let passed = sweep_step_passes(added_p99, &outcome, rate);
            let verdict = sweep_verdict(passed, attempt);
            progress(
                name,
                &format!(
                    "sweep {rate} RPS: added p99 {added_p99} us, {:.2}% errors: {}{}",
                    outcome.error_rate() * 100.0,
                    verdict.note(),
                    lanes_note(&cost.batches)
                ),
            );
            steps.push(json!({
                "rate": rate,
                "attempt": attempt,
                "achieved_rps": (outcome.rps() * 10.0).round() / 10.0,
                "gateway_p99_us": outcome.quantile(0.99),
                "direct_p99_us": direct.quantile(0.99),
                "added_p99_us": added_p99,
                "error_rate": outcome.error_rate(),
                "cpu_us_per_request": cost.cpu_us,
                "database_cpu_us_per_request": cost.database_cpu_us,
                "log_batches": cost.batches,
                "passed": passed,
            }));
            match verdict {
                SweepVerdict::Pass => break true,
                SweepVerdict::Retry => attempt += 1,
                SweepVerdict::End => {
                    past_capacity = at_rate;
                    break false;
                }
            }
        };
        if !passed {
            break;
        }
        highest = Some(rate);
    }
    let sweep_json = json!({
        "step_secs": options.sweep_duration.as_secs(),
        "criteria": format!("added p99 < {SWEEP_MAX_ADDED_P99_US} us, errors < {}%, achieved >= 95% of the rate", SWEEP_MAX_ERROR_RATE * 100.0),
        "steps": steps,
        "highest_passing_rps": highest,
        "errors_past_capacity": past_capacity.errors,
    });

    let rss_sweep = sampler.take_peak(pid);

    let log_rows = match baton_addr {
        Some(addr) => {
            // A shed request was refused before it did anything: no run, no row.
            let expected = if gateway.logs() { sent.rows } else { 0 };
            progress(
                name,
                &format!("counting invocation-log rows (expecting {expected})"),
            );
            let timeout = if gateway.logs() {
                LOG_DRAIN_TIMEOUT
            } else {
                Duration::ZERO
            };
            let rows =
                driver::wait_for_log_rows(&client, addr, procs::BOOTSTRAP_KEY, expected, timeout)
                    .await?;
            progress(
                name,
                &format!(
                    "{rows} rows for {} requests ({} shed)",
                    sent.requests, sent.shed
                ),
            );
            json!({
                "logging": gateway.logs(),
                "requests_sent": sent.requests,
                "shed": sent.shed,
                "rows": rows,
                "rows_expected": expected,
                "rows_match": rows == expected,
            })
        }
        None => {
            json!({"logging": false, "requests_sent": sent.requests, "note": "not Baton: no request log (LiteLLM runs without a database)"})
        }
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after = procs::rss_kb(pid);
    drop(sampler);

    Ok(json!({
        "name": name,
        "concurrency_1": c1_json,
        "concurrency": conc_json,
        "fixed_rate": fixed,
        "flows": flows_json,
        "sweep": sweep_json,
        "streams": streams_json,
        "concurrent_streams": many_json,
        "cpu_us_per_request": cpu,
        "rss_kb": {
            "idle": rss_idle,
            "under_load_peak": rss_load,
            "concurrent_streams_peak": rss_streams,
            "sweep_peak": rss_sweep,
            "after_load": rss_after,
        },
        "log_rows": log_rows,
        "requests_sent": sent.requests,
        "errors": sent.errors,
        "shed": sent.shed,
    }))
}

/// Whether a sweep step held its rate: added p99 under the bound, errors under the rate, and
/// nearly every request sent (the driver kept up).
fn sweep_step_passes(added_p99: i64, outcome: &Outcome, rate: u64) -> bool {
    added_p99 < SWEEP_MAX_ADDED_P99_US
        && outcome.error_rate() < SWEEP_MAX_ERROR_RATE
        && outcome.rps() >= 0.95 * rate as f64
}

/// What a sweep does after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SweepVerdict {
    Pass,
    /// Failed for the first time: the same rate once more.
    Retry,
    /// Failed twice: the rate is past what the gateway holds.
    End,
}

impl SweepVerdict {
    fn note(self) -> &'static str {
        match self {
            SweepVerdict::Pass => "pass",
            SweepVerdict::Retry => "fail (once more)",
            SweepVerdict::End => "fail (sweep ends)",
        }
    }
}

fn sweep_verdict(passed: bool, attempt: u32) -> SweepVerdict {
    match (passed, attempt) {
        (true, _) => SweepVerdict::Pass,
        (false, 1) => SweepVerdict::Retry,
        (false, _) => SweepVerdict::End,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_sweep_step_is_tried_once_more_before_the_sweep_ends() {
        assert_eq!(sweep_verdict(true, 1), SweepVerdict::Pass);
        assert_eq!(sweep_verdict(false, 1), SweepVerdict::Retry);
        assert_eq!(sweep_verdict(true, 2), SweepVerdict::Pass);
        assert_eq!(sweep_verdict(false, 2), SweepVerdict::End);
    }

    #[test]
    fn the_mock_s_capacity_is_its_throughput_over_its_busy_share() {
        // Busy half its thread at 60k RPS: a whole thread would serve 120k.
        assert_eq!(mock_capacity(60_000.0, Some(0.5)), Some(120_000.0));
        // A share over one core (a second thread's moment) counts as the whole core.
        assert_eq!(mock_capacity(60_000.0, Some(1.2)), Some(60_000.0));
        // Unread, or too small a share to divide by: no capacity, the direct ratio is used.
        assert_eq!(mock_capacity(60_000.0, None), None);
        assert_eq!(mock_capacity(60_000.0, Some(0.0)), None);
    }
}
