//! The report: `target/bench/load.json`, the printed tables (Markdown, so a run's output can go
//! into `docs/benchmarks.md` as it is), issue 9's targets met or not, the ratios to LiteLLM.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::ensure;
use serde_json::{Value, json};

use super::options::Options;
use super::procs::Pinning;
use super::scenarios::Baseline;

pub fn assemble(
    options: &Options,
    pinning: &Pinning,
    baseline: &Baseline,
    gateways: Vec<Value>,
    elapsed: Duration,
) -> Value {
    let targets = targets(options, &gateways);
    let ratios = ratios(&gateways);
    json!({
        "machine": machine_description(),
        "pinning": pinning.note,
        "smoke": options.smoke,
        "options": {
            "duration_secs": options.duration.as_secs(),
            "sweep_step_secs": options.sweep_duration.as_secs(),
            "rates": options.rates,
            "sweep": options.sweep,
            "concurrency": options.concurrency,
            "streams": options.streams,
            "concurrent_streams": options.concurrent_streams,
            "mock_delay_ms": options.mock_delay_ms,
            // A smoke run uses the dev builds of `cargo test`, whatever the option says.
            "profile": if options.smoke { "dev" } else { options.profile.as_str() },
            // Baton's binary: the profile's, or the profile-guided one (`cargo xtask pgo`).
            "pgo": options.pgo,
        },
        "elapsed_secs": elapsed.as_secs(),
        "direct": baseline.json(),
        "gateways": gateways,
        "targets": targets,
        "ratios": ratios,
    })
}

fn live(gateways: &[Value]) -> impl Iterator<Item = &Value> {
    gateways.iter().filter(|g| g.get("skipped").is_none())
}

fn at_rate(gateway: &Value, rate: u64) -> Option<&Value> {
    gateway["fixed_rate"]
        .as_array()?
        .iter()
        .find(|p| p["rate"] == rate && p.get("skipped").is_none())
}

/// Baton's gateways, not the peer or the floor proxy: the targets and ratios are Baton's.
fn is_baton(gateway: &Value) -> bool {
    gateway["name"]
        .as_str()
        .is_some_and(|name| name.starts_with("baton-"))
}

fn target(gateway: &Value, name: &str, value: String, met: Option<bool>) -> Value {
    json!({"gateway": gateway["name"], "target": name, "value": value, "met": met})
}

/// Issue 9's targets for each Baton gateway that ran; `met` is null where the run did not
/// measure it (e.g. no 1,000 RPS phase, fewer than 1,000 streams, no peer).
fn targets(options: &Options, gateways: &[Value]) -> Vec<Value> {
    let litellm = live(gateways).find(|g| g["name"] == "litellm");
    let mut out = Vec::new();
    for g in live(gateways).filter(|g| is_baton(g)) {
        let c1 = g["concurrency_1"]["added_p99_us"]
            .as_i64()
            .unwrap_or(i64::MAX);
        out.push(target(
            g,
            "added p99 at concurrency 1 <= 150 us",
            format!("{c1} us"),
            Some(c1 <= 150),
        ));
        let k1 = at_rate(g, 1000).and_then(|p| p["added_p99_us"].as_i64());
        out.push(target(
            g,
            "added p99 at 1,000 RPS <= 1 ms",
            k1.map_or("not run".into(), |v| format!("{v} us")),
            k1.map(|v| v <= 1000),
        ));
        // Two readings of one target: in the closed loop (the condition of LiteLLM's ~16 ms
        // anchor, concurrency 50) requests share wake-ups; at a fixed 1,000 RPS nearly every
        // request wakes the process on its own, and on a VM each wake-up costs a halted vCPU's.
        let closed = g["concurrency"]["cpu_us_per_request"].as_f64();
        out.push(target(
            g,
            "CPU per request <= 150 us (closed loop, as LiteLLM's anchor)",
            closed.map_or("n/a".into(), |v| {
                format!("{v:.0} us (concurrency {})", options.concurrency)
            }),
            closed.map(|v| v <= 150.0),
        ));
        let open = at_rate(g, 1000).and_then(|p| p["cpu_us_per_request"].as_f64());
        out.push(target(
            g,
            "CPU per request <= 150 us at 1,000 RPS",
            open.map_or("not run".into(), |v| format!("{v:.0} us")),
            open.map(|v| v <= 150.0),
        ));
        let idle = g["rss_kb"]["idle"].as_f64().unwrap_or(0.0) / 1024.0;
        out.push(target(
            g,
            "idle RSS <= 40 MB",
            format!("{idle:.1} MB"),
            Some(idle <= 40.0),
        ));
        let streams = &g["concurrent_streams"];
        let peak = streams["peak_rss_kb"].as_f64().unwrap_or(0.0) / 1024.0;
        let full = options.concurrent_streams >= 1000;
        out.push(target(
            g,
            "RSS <= 150 MB at 1,000 concurrent streams",
            format!(
                "{peak:.1} MB at {} streams ({} succeeded)",
                streams["count"], streams["succeeded"]
            ),
            full.then_some(peak <= 150.0 && streams["succeeded"] == streams["count"]),
        ));
        let ttft = g["streams"]["added_ttft_p99_us"]
            .as_i64()
            .unwrap_or(i64::MAX);
        // A difference of two tails: below zero, the direct phase's tail was the noisier one and
        // the run measured nothing about Baton's.
        let (ttft_value, ttft_met) = if ttft < 0 {
            (
                format!("{ttft} us: direct p99 above the gateway's, not measured"),
                None,
            )
        } else {
            (format!("{ttft} us"), Some(ttft <= 500))
        };
        out.push(target(
            g,
            "streaming added TTFT p99 <= 0.5 ms",
            ttft_value,
            ttft_met,
        ));
        let logs = &g["log_rows"];
        if logs["logging"] == true {
            out.push(target(
                g,
                "zero log rows lost",
                format!(
                    "{} rows for {} runs of {} requests ({} shed)",
                    logs["rows"], logs["rows_expected"], logs["requests_sent"], logs["shed"]
                ),
                Some(logs["rows_match"] == true),
            ));
            let ratio = litellm.and_then(|l| {
                Some(g["concurrency"]["rps"].as_f64()? / l["concurrency"]["rps"].as_f64()?)
            });
            out.push(target(
                g,
                "throughput with logging on >= 100x LiteLLM (one worker)",
                ratio.map_or("no peer (--peer litellm)".into(), |r| format!("{r:.1}x")),
                ratio.map(|r| r >= 100.0),
            ));
        } else {
            out.push(target(
                g,
                "no log rows with logging off",
                format!("{} rows", logs["rows"]),
                Some(logs["rows_match"] == true),
            ));
        }
        let headroom = &g["concurrency"]["mock_headroom"];
        let note = headroom_note(g);
        out.push(target(
            g,
            "mock headroom >= 5x (mock capacity / gateway's throughput)",
            if g["concurrency"]["mock_headroom_ok"] == true {
                format!("{headroom}x{note}")
            } else {
                format!("{headroom}x: mock headroom insufficient{note}")
            },
            Some(g["concurrency"]["mock_headroom_ok"] == true),
        ));
        // The rate that ends the sweep is past the gateway's capacity on purpose: what its
        // attempts were refused (503 `OVERLOADED`, load shedding) is the designed answer.
        let errors = g["errors"].as_u64().unwrap_or(0);
        let past_capacity = g["sweep"]["errors_past_capacity"].as_u64().unwrap_or(0);
        let failed = errors.saturating_sub(past_capacity);
        out.push(target(
            g,
            "no failed requests (the sweep's step past capacity aside)",
            match past_capacity {
                0 => format!("{failed} of {}", g["requests_sent"]),
                _ => format!(
                    "{failed} of {} ({past_capacity} refused in the sweep's step past capacity)",
                    g["requests_sent"]
                ),
            },
            Some(failed == 0),
        ));
    }
    out
}

/// Baton gateway against LiteLLM, each ratio oriented so that above 1 favours Baton.
fn ratios(gateways: &[Value]) -> Vec<Value> {
    let Some(litellm) = live(gateways).find(|g| g["name"] == "litellm") else {
        return Vec::new();
    };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some((a / b * 10.0).round() / 10.0),
        _ => None,
    };
    let f = |v: &Value| v.as_f64();
    live(gateways)
        .filter(|g| is_baton(g))
        .map(|g| {
            json!({
                "gateway": g["name"],
                "throughput_x": ratio(f(&g["concurrency"]["rps"]), f(&litellm["concurrency"]["rps"])),
                "highest_sustained_rate_x": ratio(f(&g["sweep"]["highest_passing_rps"]), f(&litellm["sweep"]["highest_passing_rps"])),
                "cpu_per_request_x_closed_loop": ratio(f(&litellm["concurrency"]["cpu_us_per_request"]), f(&g["concurrency"]["cpu_us_per_request"])),
                "cpu_per_request_x_concurrency_1": ratio(f(&litellm["concurrency_1"]["cpu_us_per_request"]), f(&g["concurrency_1"]["cpu_us_per_request"])),
                "rss_idle_x": ratio(f(&litellm["rss_kb"]["idle"]), f(&g["rss_kb"]["idle"])),
                "rss_under_load_x": ratio(f(&litellm["rss_kb"]["under_load_peak"]), f(&g["rss_kb"]["under_load_peak"])),
                "added_p99_concurrency_1_x": ratio(f(&litellm["concurrency_1"]["added_p99_us"]), f(&g["concurrency_1"]["added_p99_us"])),
                "added_ttft_p99_x": ratio(f(&litellm["streams"]["added_ttft_p99_us"]), f(&g["streams"]["added_ttft_p99_us"])),
            })
        })
        .collect()
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
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    json!({
        "cpus": std::thread::available_parallelism().map(usize::from).unwrap_or(1),
        "cpu_model": cpu,
        "cpu_idle": cpu_idle_policy(),
        "load_average_at_end": load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    })
}

/// How an idle CPU waits, e.g. `"haltpoll, guest_halt_poll_ns 0"`: on a virtual machine an idle
/// vCPU that halts at once pays an exit and an entry on its next wake-up, which moves every
/// figure taken between idle gaps (concurrency 1, fixed rates, stream TTFT) by tens of
/// microseconds (`docs/performance.md`, "Cold requests"), so runs compare only with the same policy.
fn cpu_idle_policy() -> String {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let Some(driver) = read("/sys/devices/system/cpu/cpuidle/current_driver") else {
        return "unknown".into();
    };
    match read("/sys/module/haltpoll/parameters/guest_halt_poll_ns") {
        Some(poll_ns) if driver == "haltpoll" => format!("{driver}, guest_halt_poll_ns {poll_ns}"),
        _ => driver,
    }
}

fn num(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => group(i),
            (None, Some(f)) => format!("{f:.1}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// 12345 -> "12,345".
fn group(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// `" (direct 4.3x; mock busy 15%)"`: beside the headroom against the mock's capacity, the
/// direct closed loop's throughput over the gateway's, and the share of its threads the
/// mock was busy while the gateway was measured; each left out when not read.
fn headroom_note(gateway: &Value) -> String {
    let conc = &gateway["concurrency"];
    let parts: Vec<String> = [
        conc["direct_throughput_ratio"]
            .as_f64()
            .map(|ratio| format!("direct {ratio:.1}x")),
        conc["mock_cpu_share"]
            .as_f64()
            .map(|share| format!("mock busy {:.0}%", share * 100.0)),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join("; "))
    }
}

fn pair(a: &Value, b: &Value) -> String {
    format!("{} / {}", num(a), num(b))
}

fn mb(v: &Value) -> String {
    v.as_f64()
        .map_or("-".into(), |kb| format!("{:.1}", kb / 1024.0))
}

type Cell = Box<dyn Fn(&Value) -> String>;

pub fn print(report: &Value, path: &Path) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let gateways: Vec<&Value> = report["gateways"]
        .as_array()
        .map(|g| g.iter().collect())
        .unwrap_or_default();
    let direct = &report["direct"];
    let options = &report["options"];
    writeln!(
        out,
        "\nBaton load benchmark ({}; {} CPUs, {}; idle: {}; load average at the end {}; {} s)\nWritten to {}\n",
        report["pinning"].as_str().unwrap_or(""),
        report["machine"]["cpus"],
        report["machine"]["cpu_model"].as_str().unwrap_or(""),
        report["machine"]["cpu_idle"].as_str().unwrap_or("unknown"),
        report["machine"]["load_average_at_end"]
            .as_str()
            .unwrap_or(""),
        report["elapsed_secs"],
        path.display()
    )?;
    for g in gateways.iter().filter(|g| g.get("skipped").is_some()) {
        writeln!(out, "{} skipped: {}\n", g["name"], g["skipped"])?;
    }
    let live: Vec<&Value> = gateways
        .iter()
        .copied()
        .filter(|g| g.get("skipped").is_none())
        .collect();

    let mut rows: Vec<(String, String, Cell)> = Vec::new();
    let c1 = &direct["concurrency_1"];
    rows.push((
        "concurrency 1: p50 / p99 us".into(),
        pair(&c1["p50_us"], &c1["p99_us"]),
        Box::new(|g| {
            pair(
                &g["concurrency_1"]["gateway"]["p50_us"],
                &g["concurrency_1"]["gateway"]["p99_us"],
            )
        }),
    ));
    rows.push((
        "concurrency 1: added p50 / p99 us".into(),
        String::new(),
        Box::new(|g| {
            pair(
                &g["concurrency_1"]["added_p50_us"],
                &g["concurrency_1"]["added_p99_us"],
            )
        }),
    ));
    let direct_rates = direct["rates"].as_array().cloned().unwrap_or_default();
    let direct_at = move |rate: &Value, secs: &Value| {
        direct_rates
            .iter()
            .find(|r| {
                r["rate"] == *rate && r["duration_ms"].as_u64() == secs.as_u64().map(|s| s * 1000)
            })
            .map(|r| r["direct"].clone())
            .unwrap_or(Value::Null)
    };
    for rate in options["rates"].as_array().cloned().unwrap_or_default() {
        let d = direct_at(&rate, &options["duration_secs"]);
        let (r1, r2, r3) = (rate.clone(), rate.clone(), rate.clone());
        let skipped = move |g: &Value, rate: &Value| -> Option<String> {
            g["fixed_rate"]
                .as_array()?
                .iter()
                .find(|p| p["rate"] == *rate)
                .and_then(|p| p["skipped"].as_str().map(|_| "skipped".to_string()))
        };
        rows.push((
            format!("{} RPS: p50 / p99 us", num(&rate)),
            pair(&d["p50_us"], &d["p99_us"]),
            Box::new(move |g| {
                skipped(g, &r1).unwrap_or_else(|| {
                    at_rate(g, r1.as_u64().unwrap_or(0)).map_or("-".into(), |p| {
                        pair(&p["gateway"]["p50_us"], &p["gateway"]["p99_us"])
                    })
                })
            }),
        ));
        rows.push((
            format!("{} RPS: added p50 / p99 us", num(&rate)),
            String::new(),
            Box::new(move |g| {
                skipped(g, &r2).unwrap_or_else(|| {
                    at_rate(g, r2.as_u64().unwrap_or(0))
                        .map_or("-".into(), |p| pair(&p["added_p50_us"], &p["added_p99_us"]))
                })
            }),
        ));
        rows.push((
            format!("{} RPS: achieved RPS, CPU us/request", num(&rate)),
            num(&d["rps"]),
            Box::new(move |g| {
                at_rate(g, r3.as_u64().unwrap_or(0)).map_or("-".into(), |p| {
                    pair(&p["gateway"]["rps"], &p["cpu_us_per_request"])
                })
            }),
        ));
    }
    rows.push((
        "highest rate with added p99 < 1 ms, < 0.1% errors".into(),
        String::new(),
        Box::new(|g| {
            let steps = g["sweep"]["steps"].as_array().map_or(0, Vec::len);
            match &g["sweep"]["highest_passing_rps"] {
                Value::Null if steps == 0 => "not run".into(),
                Value::Null => "none".into(),
                v => format!("{} RPS", num(v)),
            }
        }),
    ));
    let conc = &direct["concurrency"];
    rows.push((
        format!("concurrency {}: RPS / p99 us", options["concurrency"]),
        pair(&conc["rps"], &conc["p99_us"]),
        Box::new(|g| {
            pair(
                &g["concurrency"]["gateway"]["rps"],
                &g["concurrency"]["gateway"]["p99_us"],
            )
        }),
    ));
    rows.push((
        "mock headroom (mock capacity / gateway RPS)".into(),
        String::new(),
        Box::new(|g| {
            let ok = g["concurrency"]["mock_headroom_ok"] == true;
            format!(
                "{}x{}{}",
                num(&g["concurrency"]["mock_headroom"]),
                if ok { "" } else { " INSUFFICIENT" },
                headroom_note(g)
            )
        }),
    ));
    rows.push((
        "CPU us/request: concurrency 1 / closed loop".into(),
        String::new(),
        Box::new(|g| {
            pair(
                &g["concurrency_1"]["cpu_us_per_request"],
                &g["concurrency"]["cpu_us_per_request"],
            )
        }),
    ));
    rows.push((
        "database server CPU us/request: concurrency 1 / closed loop / 1,000 RPS".into(),
        String::new(),
        Box::new(|g| {
            let database = |phase: &Value| phase["database_cpu_us_per_request"].clone();
            let at_1000 = at_rate(g, 1000).map_or(Value::Null, database);
            if database(&g["concurrency_1"]).is_null() && at_1000.is_null() {
                return "-".into();
            }
            format!(
                "{} / {}",
                pair(&database(&g["concurrency_1"]), &database(&g["concurrency"])),
                num(&at_1000)
            )
        }),
    ));
    for (kind, label) in [
        ("flow_run", "flow run (1 model call)"),
        ("agent_tree", "agent tree (3 model calls, 2 runs)"),
    ] {
        rows.push((
            format!("{label}, concurrency 1: p50 / p99 us"),
            pair(&c1["p50_us"], &c1["p99_us"]),
            Box::new(move |g| {
                let c1 = &g["flows"][kind]["concurrency_1"];
                pair(&c1["gateway"]["p50_us"], &c1["gateway"]["p99_us"])
            }),
        ));
        rows.push((
            format!("{label}: closed-loop RPS; CPU us a request, concurrency 1 / closed loop"),
            String::new(),
            Box::new(move |g| {
                let flow = &g["flows"][kind];
                if flow.is_null() {
                    return "-".into();
                }
                let database = |phase: &str| &flow[phase]["database_cpu_us_per_request"];
                // A PostgreSQL gateway's logging work is the database server's CPU.
                let database_note = if database("concurrency_1").is_null() {
                    String::new()
                } else {
                    format!(
                        " (database server {})",
                        pair(database("concurrency_1"), database("concurrency"))
                    )
                };
                format!(
                    "{}; {}{database_note}",
                    num(&flow["concurrency"]["rps"]),
                    pair(
                        &flow["concurrency_1"]["cpu_us_per_request"],
                        &flow["concurrency"]["cpu_us_per_request"]
                    )
                )
            }),
        ));
    }
    let streams = &direct["streams"];
    rows.push((
        format!("{} streams: TTFT p50 / p99 us", options["streams"]),
        pair(&streams["ttft"]["p50_us"], &streams["ttft"]["p99_us"]),
        Box::new(|g| {
            pair(
                &g["streams"]["gateway"]["ttft"]["p50_us"],
                &g["streams"]["gateway"]["ttft"]["p99_us"],
            )
        }),
    ));
    rows.push((
        "streams: added TTFT p50 / p99 us".into(),
        String::new(),
        Box::new(|g| {
            pair(
                &g["streams"]["added_ttft_p50_us"],
                &g["streams"]["added_ttft_p99_us"],
            )
        }),
    ));
    rows.push((
        "streams: inter-chunk gap p50 / p99 us".into(),
        pair(&streams["gap"]["p50_us"], &streams["gap"]["p99_us"]),
        Box::new(|g| {
            pair(
                &g["streams"]["gateway"]["gap"]["p50_us"],
                &g["streams"]["gateway"]["gap"]["p99_us"],
            )
        }),
    ));
    let many = &direct["concurrent_streams"];
    rows.push((
        format!(
            "{} concurrent streams: ok / TTFT p99 us",
            options["concurrent_streams"]
        ),
        format!(
            "{} / {}",
            num(&json!(
                many["ttft"]["requests"].as_i64().unwrap_or(0)
                    - many["ttft"]["errors"].as_i64().unwrap_or(0)
            )),
            num(&many["ttft"]["p99_us"])
        ),
        Box::new(|g| {
            pair(
                &g["concurrent_streams"]["succeeded"],
                &g["concurrent_streams"]["gateway"]["ttft"]["p99_us"],
            )
        }),
    ));
    rows.push((
        "concurrent streams: added TTFT p99 us / peak RSS MB".into(),
        String::new(),
        Box::new(|g| {
            format!(
                "{} / {}",
                num(&g["concurrent_streams"]["added_ttft_p99_us"]),
                mb(&g["concurrent_streams"]["peak_rss_kb"])
            )
        }),
    ));
    rows.push((
        "RSS MB: idle / load peak / after".into(),
        String::new(),
        Box::new(|g| {
            format!(
                "{} / {} / {}",
                mb(&g["rss_kb"]["idle"]),
                mb(&g["rss_kb"]["under_load_peak"]),
                mb(&g["rss_kb"]["after_load"])
            )
        }),
    ));
    rows.push((
        "log rows / runs made (requests sent)".into(),
        String::new(),
        Box::new(|g| {
            let log = &g["log_rows"];
            if log.get("rows").is_some() {
                format!(
                    "{} ({})",
                    pair(&log["rows"], &log["rows_expected"]),
                    num(&log["requests_sent"])
                )
            } else {
                format!("no log / {}", num(&g["log_rows"]["requests_sent"]))
            }
        }),
    ));
    rows.push((
        "errors".into(),
        String::new(),
        Box::new(|g| match g.get("shed") {
            Some(shed) if shed != 0 => format!("{} ({} shed)", num(&g["errors"]), num(shed)),
            _ => num(&g["errors"]),
        }),
    ));

    write!(out, "| figure | direct |")?;
    for g in &live {
        write!(out, " {} |", g["name"].as_str().unwrap_or(""))?;
    }
    writeln!(out)?;
    writeln!(out, "|---|---|{}", "---|".repeat(live.len()))?;
    for (label, direct_cell, cell) in &rows {
        write!(out, "| {label} | {direct_cell} |")?;
        for g in &live {
            write!(out, " {} |", cell(g))?;
        }
        writeln!(out)?;
    }

    writeln!(
        out,
        "\n| gateway | issue 9 target | value | met |\n|---|---|---|---|"
    )?;
    for t in report["targets"].as_array().into_iter().flatten() {
        let met = match t["met"].as_bool() {
            Some(true) => "met",
            Some(false) => "**not met**",
            None => "n/a",
        };
        writeln!(
            out,
            "| {} | {} | {} | {met} |",
            t["gateway"].as_str().unwrap_or(""),
            t["target"].as_str().unwrap_or(""),
            t["value"].as_str().unwrap_or("")
        )?;
    }
    let ratios = report["ratios"].as_array().cloned().unwrap_or_default();
    if !ratios.is_empty() {
        writeln!(
            out,
            "\n| Baton vs LiteLLM (above 1 favours Baton) | throughput | highest sustained rate | CPU/request (closed loop) | CPU/request (c=1) | RSS idle | RSS under load | added p99 c=1 | added TTFT p99 |\n|---|---|---|---|---|---|---|---|---|"
        )?;
        for r in &ratios {
            let x = |v: &Value| match v.as_f64() {
                Some(f) => format!("{f:.1}x"),
                None => "-".into(),
            };
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r["gateway"].as_str().unwrap_or(""),
                x(&r["throughput_x"]),
                x(&r["highest_sustained_rate_x"]),
                x(&r["cpu_per_request_x_closed_loop"]),
                x(&r["cpu_per_request_x_concurrency_1"]),
                x(&r["rss_idle_x"]),
                x(&r["rss_under_load_x"]),
                x(&r["added_p99_concurrency_1_x"]),
                x(&r["added_ttft_p99_x"]),
            )?;
        }
    }
    Ok(())
}

/// What `--smoke` (CI) insists on: every requested gateway ran, nothing failed, and the
/// invocation log holds exactly one row per request (none with logging off).
pub fn smoke_checks(report: &Value) -> anyhow::Result<()> {
    for g in report["gateways"].as_array().into_iter().flatten() {
        let name = g["name"].as_str().unwrap_or("?");
        ensure!(
            g.get("skipped").is_none(),
            "{name} was skipped: {}",
            g["skipped"]
        );
        ensure!(
            g["errors"] == 0,
            "{name}: {} of {} requests failed",
            g["errors"],
            g["requests_sent"]
        );
        if g["log_rows"].get("rows").is_some() {
            ensure!(
                g["log_rows"]["rows_match"] == true,
                "{name}: the invocation log has {} rows for {} runs of {} requests (logging {})",
                g["log_rows"]["rows"],
                g["log_rows"]["rows_expected"],
                g["log_rows"]["requests_sent"],
                if g["log_rows"]["logging"] == true {
                    "on"
                } else {
                    "off"
                }
            );
        }
        if is_baton(g) {
            for kind in ["flow_run", "agent_tree"] {
                let runs = g["flows"][kind]["concurrency"]["gateway"]["requests"]
                    .as_u64()
                    .unwrap_or(0);
                ensure!(runs > 0, "{name}: no {kind} was measured");
            }
        }
        ensure!(
            g["concurrent_streams"]["succeeded"] == g["concurrent_streams"]["count"],
            "{name}: {} of {} concurrent streams succeeded",
            g["concurrent_streams"]["succeeded"],
            g["concurrent_streams"]["count"]
        );
    }
    let direct = &report["direct"];
    for phase in ["concurrency_1", "concurrency"] {
        ensure!(
            direct[phase]["errors"] == 0,
            "direct {phase}: {} errors",
            direct[phase]["errors"]
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_grouped() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(-1234567), "-1,234,567");
        assert_eq!(num(&json!(12.34)), "12.3");
        assert_eq!(num(&Value::Null), "-");
    }

    #[test]
    fn the_direct_ratio_and_the_mock_s_cpu_share_are_shown_beside_its_headroom_when_read() {
        let read = json!({"concurrency": {"direct_throughput_ratio": 4.3, "mock_cpu_share": 0.15}});
        assert_eq!(headroom_note(&read), " (direct 4.3x; mock busy 15%)");
        let share_unread =
            json!({"concurrency": {"direct_throughput_ratio": 4.3, "mock_cpu_share": null}});
        assert_eq!(headroom_note(&share_unread), " (direct 4.3x)");
        let unread =
            json!({"concurrency": {"direct_throughput_ratio": null, "mock_cpu_share": null}});
        assert_eq!(headroom_note(&unread), "");
    }

    #[test]
    fn targets_and_ratios_are_baton_s_alone() {
        let gateway = |name: &str| {
            json!({"name": name, "concurrency_1": {"added_p99_us": 100},
                   "concurrency": {"rps": 1000.0}, "rss_kb": {"idle": 1024}})
        };
        let gateways = [
            gateway("baton-sqlite"),
            gateway("floor"),
            gateway("litellm"),
        ];
        let options = Options::parse(&[]).unwrap();
        let judged: Vec<Value> = targets(&options, &gateways)
            .into_iter()
            .map(|t| t["gateway"].clone())
            .collect();
        assert!(!judged.is_empty());
        assert!(judged.iter().all(|g| g == "baton-sqlite"), "{judged:?}");
        let compared = ratios(&gateways);
        assert_eq!(compared.len(), 1);
        assert_eq!(compared[0]["gateway"], "baton-sqlite");
    }

    /// Refusals in the sweep's step past capacity are the designed answer; any other error
    /// fails the target.
    #[test]
    fn failed_requests_leave_out_the_sweeps_step_past_capacity() {
        let gateway = |errors: u64, past_capacity: u64| {
            json!({"name": "baton-sqlite", "errors": errors, "requests_sent": 1000,
                   "sweep": {"errors_past_capacity": past_capacity}})
        };
        let options = Options::parse(&[]).unwrap();
        let failed = |g: Value| {
            targets(&options, &[g])
                .into_iter()
                .find(|t| {
                    t["target"]
                        .as_str()
                        .unwrap_or("")
                        .starts_with("no failed requests")
                })
                .unwrap()
        };
        let shed_in_sweep = failed(gateway(40, 40));
        assert_eq!(shed_in_sweep["met"], true, "{shed_in_sweep}");
        assert!(
            shed_in_sweep["value"]
                .as_str()
                .unwrap()
                .contains("40 refused")
        );
        assert_eq!(failed(gateway(41, 40))["met"], false);
        assert_eq!(failed(gateway(0, 0))["met"], true);
        assert_eq!(failed(gateway(3, 0))["met"], false);
    }

    #[test]
    fn smoke_fails_on_lost_rows_and_passes_when_all_match() {
        let gateway = |rows_match: bool| {
            json!({"name": "baton-sqlite", "errors": 0, "requests_sent": 10,
                   "log_rows": {"logging": true, "rows": 9, "rows_expected": 10, "requests_sent": 10, "rows_match": rows_match},
                   "concurrent_streams": {"count": 5, "succeeded": 5},
                   "flows": {"flow_run": {"concurrency": {"gateway": {"requests": 3}}},
                             "agent_tree": {"concurrency": {"gateway": {"requests": 2}}}}})
        };
        let report = |g: Value| json!({"gateways": [g], "direct": {"concurrency_1": {"errors": 0}, "concurrency": {"errors": 0}}});
        let err = smoke_checks(&report(gateway(false)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("9 rows for 10 runs of 10 requests"), "{err}");
        smoke_checks(&report(gateway(true))).unwrap();
        let mut no_trees = gateway(true);
        no_trees["flows"]["agent_tree"] = Value::Null;
        let err = smoke_checks(&report(no_trees)).unwrap_err().to_string();
        assert!(err.contains("no agent_tree was measured"), "{err}");
        let skipped = json!({"name": "baton-postgres", "skipped": "unreachable"});
        assert!(smoke_checks(&report(skipped)).is_err());
    }
}
