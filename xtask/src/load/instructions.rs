//! `cargo xtask bench instructions`: what one request costs Baton in instructions, counted by
//! callgrind instead of timed (`docs/benchmarks.md`). On a shared VM timings move 15-20% from
//! one run to the next; the total moves by 2-3% (work that runs by the clock), and a function's
//! own count in the kept callgrind files by far less, so changes of a few percent show.
//!
//! For each configuration Baton (release build) runs twice under
//! `valgrind --tool=callgrind`: once for a warm-up alone, once for the warm-up and then
//! `--requests` one-call chat completions, one at a time, against the fast mock. The
//! difference of the two totals, divided by the requests, is the cost of one request in every
//! thread of the process (serving threads, log writer, database connection), start-up and
//! shutdown cancelling out. The log writer is given 60 s to fill a batch of 256 runs, so its
//! batches are as full as under load although requests arrive only ~100 a second under
//! valgrind; load shedding is off, so no timer ticks by the clock. System calls' work in the
//! kernel is not counted. With `--cache-sim`, callgrind simulates the caches as well and the
//! misses a request are reported beside the instructions. `--scenario flow` counts flow runs
//! instead (a pinned flow's template rendered, one model call), `--scenario agent-tree` agent
//! trees (an Agent tool's sub-run: three model calls, two runs); both set up in each run
//! before the warm-up, so the setup cancels out too. `--scenario stream` counts streamed chat
//! completions (the load benchmark's short stream, read to `[DONE]`): beside `chat`, what the
//! streaming path costs, the code behind the streamed first-token figure.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use serde_json::{Value, json};

use super::driver;
use super::flows;
use super::procs::{self, BatonSpec, TempDir};
use super::{baton_target, build, target_dir};

const USAGE: &str = "usage: cargo xtask bench instructions [--requests N] [--warm-up N] \
                     [--gateways sqlite,nolog] [--pgo] [--cache-sim] \
                     [--scenario chat|stream|flow|agent-tree] [--profile NAME]";

/// Runs per log batch (the default's size), given a minute to fill.
const LOG_BATCH: u64 = 256;

struct Options {
    requests: u64,
    warm_up: u64,
    /// Invocation log on (`sqlite`) and/or off (`nolog`).
    logged: Vec<bool>,
    /// Count the profile-guided `baton` of `cargo xtask pgo` instead of the release build's.
    pgo: bool,
    /// Simulate the caches too (callgrind's `--cache-sim=yes`): instruction-cache misses a
    /// request show how compactly the code a request runs is laid out, which the instruction
    /// count does not (a layout change such as BOLT's moves them, not the count).
    cache_sim: bool,
    scenario: Scenario,
    /// The Cargo profile `baton` and the mock are built with: `release` (fat LTO) for recorded
    /// figures, `release-check` (no LTO) to compare two versions of a change in minutes.
    profile: String,
}

/// What one counted request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    /// A one-call chat completion (the compatible endpoint).
    Chat,
    /// The same, streamed: the bench's short stream, read to its end.
    Stream,
    /// A run of a flow pinned to an environment.
    Flow,
    /// A run of a flow whose Agent tool runs another flow.
    AgentTree,
}

impl Scenario {
    fn parse(name: &str) -> anyhow::Result<Scenario> {
        Ok(match name {
            "chat" => Scenario::Chat,
            "stream" => Scenario::Stream,
            "flow" => Scenario::Flow,
            "agent-tree" => Scenario::AgentTree,
            other => bail!("unknown scenario {other:?}: chat, stream, flow or agent-tree"),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Scenario::Chat => "chat",
            Scenario::Stream => "stream",
            Scenario::Flow => "flow",
            Scenario::AgentTree => "agent-tree",
        }
    }
}

impl Options {
    fn parse(args: &[String]) -> anyhow::Result<Options> {
        // Whole log batches on both sides: the warm-up fills two (every insert statement the
        // writer uses has been prepared before counting starts) and the requests four, so both
        // runs end with the same partial batch at shutdown.
        let mut options = Options {
            requests: 4 * LOG_BATCH,
            warm_up: 2 * LOG_BATCH,
            logged: vec![true, false],
            pgo: false,
            cache_sim: false,
            scenario: Scenario::Chat,
            profile: super::options::DEFAULT_PROFILE.into(),
        };
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let mut value = || {
                args.next()
                    .with_context(|| format!("{flag} needs a value\n{USAGE}"))
            };
            match flag.as_str() {
                "--requests" => options.requests = value()?.parse().context("--requests")?,
                "--warm-up" => options.warm_up = value()?.parse().context("--warm-up")?,
                "--gateways" => {
                    options.logged = value()?
                        .split(',')
                        .map(|name| match name.trim() {
                            "sqlite" => Ok(true),
                            "nolog" => Ok(false),
                            other => bail!("unknown gateway {other:?}: sqlite or nolog"),
                        })
                        .collect::<anyhow::Result<_>>()?;
                }
                "--pgo" => options.pgo = true,
                "--cache-sim" => options.cache_sim = true,
                "--scenario" => options.scenario = Scenario::parse(value()?)?,
                "--profile" => options.profile = super::options::profile(value()?)?,
                "--help" | "-h" => bail!("{USAGE}"),
                other => bail!("unknown option {other:?}\n{USAGE}"),
            }
        }
        ensure!(options.requests > 0, "--requests must be at least 1");
        Ok(options)
    }
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let options = Options::parse(args)?;
    let valgrind = Command::new("valgrind").arg("--version").output();
    ensure!(
        valgrind.is_ok_and(|out| out.status.success()),
        "valgrind is not installed (Debian: apt-get install valgrind)"
    );
    // As for `bench load`: the debug xtask (`cargo xtask`) builds the release binaries; a
    // release xtask run by hand uses what is there. The client's speed does not matter here.
    if cfg!(debug_assertions) {
        build(&["--profile", &options.profile])?;
    }
    let bins = target_dir().join(&options.profile);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let bench_dir = target_dir().join("bench");
    std::fs::create_dir_all(&bench_dir)?;
    let report = runtime.block_on(measure(&options, &bins, &bench_dir))?;
    let path = bench_dir.join("instructions.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    eprintln!("bench: wrote {}", path.display());
    Ok(())
}

async fn measure(options: &Options, bins: &Path, bench_dir: &Path) -> anyhow::Result<Value> {
    let (_mock, mock_addr) = procs::start_mock(bins, &procs::bench_mock_args(0, 1), None)?;
    let program = crate::pgo::measured_baton(options.pgo, bins)?;
    let mut results = Vec::new();
    for &logged in &options.logged {
        let name = if logged {
            "baton-sqlite"
        } else {
            "baton-nolog"
        };
        eprintln!("bench: {name}: warm-up only, under callgrind");
        let scenario = options.scenario.name();
        let keep =
            |run: &str| bench_dir.join(format!("instructions-{name}-{scenario}-{run}.callgrind"));
        let run = Run {
            bins,
            program: &program,
            mock_addr: &mock_addr,
            logged,
            cache_sim: options.cache_sim,
            scenario: options.scenario,
        };
        let base = count(&run, options.warm_up, &keep("warm-up")).await?;
        eprintln!("bench: {name}: warm-up and {} requests", options.requests);
        let total = count(&run, options.warm_up + options.requests, &keep("requests")).await?;
        let per_request = |event: &str| {
            let of = |totals: &[(String, u64)]| {
                totals
                    .iter()
                    .find(|(name, _)| name == event)
                    .map_or(0, |(_, count)| *count)
            };
            of(&total).saturating_sub(of(&base)) as f64 / options.requests as f64
        };
        let instructions = per_request("Ir");
        eprintln!("bench: {name}: {instructions:.0} instructions per request");
        let mut result = json!({
            "gateway": name,
            "instructions_per_request": instructions.round(),
            "total_warm_up_only": base.first().map(|(_, count)| count),
            "total_with_requests": total.first().map(|(_, count)| count),
            "callgrind_files": [keep("warm-up"), keep("requests")],
        });
        if options.cache_sim {
            // I1mr: first-level instruction-cache misses; ILmr: of those, last-level misses.
            let misses = json!({
                "I1mr": per_request("I1mr").round(),
                "ILmr": per_request("ILmr").round(),
                "D1mr": per_request("D1mr").round(),
                "DLmr": per_request("DLmr").round(),
            });
            eprintln!("bench: {name}: cache misses per request {misses}");
            result["cache_misses_per_request"] = misses;
        }
        results.push(result);
    }
    Ok(json!({
        "requests": options.requests,
        "warm_up": options.warm_up,
        "pgo": options.pgo,
        "bolt": options.pgo && crate::pgo::is_bolted(&program)?,
        "cache_sim": options.cache_sim,
        "scenario": options.scenario.name(),
        "profile": options.profile,
        "results": results,
    }))
}

/// One configuration to count: which `baton`, with the log on or off, against which mock.
struct Run<'a> {
    bins: &'a Path,
    program: &'a Path,
    mock_addr: &'a str,
    logged: bool,
    cache_sim: bool,
    scenario: Scenario,
}

/// Every instruction Baton runs from start to exit (and, simulating the caches, every miss),
/// with `requests` requests sent in between: callgrind's totals by event, instructions (`Ir`)
/// first. Its file is kept at `keep` (for `callgrind_annotate`, per function).
async fn count(run: &Run<'_>, requests: u64, keep: &Path) -> anyhow::Result<Vec<(String, u64)>> {
    let dir = TempDir::new("instructions")?;
    let output = dir.0.join("callgrind.out");
    let database = format!("sqlite://{}", dir.0.join("baton.db").display());
    let (baton, address) = procs::start_baton(&BatonSpec {
        program: run.program.to_path_buf(),
        invocation_log: run.logged,
        wrapper: vec![
            "valgrind".into(),
            "--tool=callgrind".into(),
            format!("--callgrind-out-file={}", output.display()),
            format!("--cache-sim={}", if run.cache_sim { "yes" } else { "no" }),
        ],
        env: vec![
            // Load shedding's probes tick every 20 ms by the clock: how many fall within a run
            // depends on how fast valgrind goes, which would make the count vary with the
            // machine's load.
            ("BATON_SERVER__SHED_QUEUE_DELAY_MS".into(), "0".into()),
            (
                "BATON_INVOCATION_LOG__BATCH_MAX_RUNS".into(),
                LOG_BATCH.to_string(),
            ),
            (
                "BATON_INVOCATION_LOG__BATCH_MAX_DELAY_MS".into(),
                "60000".into(),
            ),
        ],
        ..BatonSpec::new(run.bins, &dir.0, run.mock_addr, &database)
    })?;
    let target = match run.scenario {
        Scenario::Chat | Scenario::Stream => baton_target(&address),
        scenario => {
            let flows = flows::set_up(&driver::client()?, &address).await?;
            if scenario == Scenario::Flow {
                flows.plain
            } else {
                flows.agent_tree
            }
        }
    };
    let outcome = if run.scenario == Scenario::Stream {
        let count = usize::try_from(requests).context("--requests")?;
        driver::streams(&driver::client()?, &target, count)
            .await?
            .ttft
    } else {
        driver::sequential(&target, None, Some(requests)).await?
    };
    if outcome.errors > 0 {
        bail!(
            "{} of {requests} requests failed: {}",
            outcome.errors,
            outcome.first_error.unwrap_or_default()
        );
    }
    // Shutdown writes the log's last batch; callgrind writes its counts at exit.
    baton.terminate(Duration::from_secs(300))?;
    let totals = totals(&output)?;
    std::fs::copy(&output, keep).with_context(|| format!("keeping {}", keep.display()))?;
    Ok(totals)
}

fn totals(path: &Path) -> anyhow::Result<Vec<(String, u64)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading callgrind's output {}", path.display()))?;
    parse_totals(&text).with_context(|| format!("no events and totals in {}", path.display()))
}

/// The `totals:` line of a callgrind output file, each count named by the `events:` line.
fn parse_totals(text: &str) -> Option<Vec<(String, u64)>> {
    let field = |name: &str| text.lines().find_map(|line| line.strip_prefix(name));
    let events = field("events:")?.split_whitespace();
    let counts = field("totals:")?
        .split_whitespace()
        .map(|count| count.parse().ok());
    let totals: Option<Vec<(String, u64)>> = events
        .zip(counts)
        .map(|(event, count)| Some((event.to_string(), count?)))
        .collect();
    totals.filter(|totals| totals.first().is_some_and(|(event, _)| event == "Ir"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_come_from_callgrinds_totals_line() {
        let output = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nfn=(1) main\n16 3\n\
                      summary: 1107504808\ntotals: 1107504969\n";
        assert_eq!(
            parse_totals(output),
            Some(vec![("Ir".to_string(), 1_107_504_969)])
        );
        assert_eq!(parse_totals("events: Ir\nsummary: 12\n"), None);
        let simulated = "events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\n\
                         totals: 900 300 200 40 12 8 5 3 1\n";
        let totals = parse_totals(simulated).unwrap();
        assert_eq!(totals.len(), 9);
        assert_eq!(totals[0], ("Ir".to_string(), 900));
        assert_eq!(totals[3], ("I1mr".to_string(), 40));
        assert_eq!(totals[6], ("ILmr".to_string(), 5));
    }

    #[test]
    fn options_default_to_both_configurations_and_refuse_unknown_ones() {
        let options = Options::parse(&[]).unwrap();
        assert_eq!((options.requests, options.warm_up), (1_024, 512));
        assert_eq!(options.logged, [true, false]);
        assert!(!options.cache_sim);
        assert!(Options::parse(&["--cache-sim".into()]).unwrap().cache_sim);
        let args = ["--gateways", "nolog", "--requests", "50"].map(String::from);
        let options = Options::parse(&args).unwrap();
        assert_eq!((options.requests, options.logged), (50, vec![false]));
        assert!(Options::parse(&["--gateways".into(), "postgres".into()]).is_err());
        assert!(Options::parse(&["--requests".into(), "0".into()]).is_err());
        assert_eq!(options.scenario, Scenario::Chat);
        let args = ["--scenario", "agent-tree"].map(String::from);
        assert_eq!(Options::parse(&args).unwrap().scenario, Scenario::AgentTree);
        let args = ["--scenario", "stream"].map(String::from);
        assert_eq!(Options::parse(&args).unwrap().scenario, Scenario::Stream);
        assert!(Options::parse(&["--scenario".into(), "mcp".into()]).is_err());
        assert_eq!(options.profile, "release");
        let args = ["--profile", "release-check"].map(String::from);
        assert_eq!(Options::parse(&args).unwrap().profile, "release-check");
        assert!(Options::parse(&["--profile".into(), "dev".into()]).is_err());
    }
}
