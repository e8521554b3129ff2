//! `cargo xtask bench load`: what Baton adds to every request, measured end to end on loopback
//! (`docs/benchmarks.md`).
//!
//! The debug xtask builds `baton`, the fast mock (`baton-mock`) and this xtask in release (or
//! the `--profile` given), then hands over to that optimised xtask: an unoptimised client would spend more per request than the
//! gateway it measures. (`--smoke`, for CI, uses dev builds and stays in the debug xtask.) The
//! driver starts the mock, measures every scenario directly against it, then starts each gateway
//! in turn (Baton on SQLite, on PostgreSQL, with the invocation log off; LiteLLM with
//! `--peer litellm`) and runs the same scenarios through it, reading the gateway's CPU time and
//! RSS from `/proc` and checking its invocation log holds one row per request. It writes
//! `target/bench/load.json` and prints the figures, the targets of issue 9 and the ratios.

mod conn;
pub(crate) mod driver;
pub(crate) mod flows;
pub(crate) mod instructions;
mod options;
pub(crate) mod procs;
mod report;
mod scenarios;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, ensure};
use serde_json::{Value, json};

use driver::Target;
use options::{Gateway, Options};
use procs::{BatonSpec, Pinning, TempDir};
use scenarios::{Baseline, Context, progress};

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let options = Options::parse(args)?;
    let bins = if options.smoke {
        // CI: the dev binaries `cargo test --workspace` builds (`baton` for the api tests,
        // `baton-mock` for its own test), with the same features, so nothing is rebuilt after
        // the test step; this xtask runs as it is. The smoke checks that the harness works, not
        // how fast anything is.
        cargo(&["test", "--workspace", "--no-run"])?;
        target_dir().join("debug")
    } else if cfg!(debug_assertions) {
        build(&["--profile", &options.profile])?;
        let status = Command::new(target_dir().join(&options.profile).join("xtask"))
            .current_dir(workspace_root())
            .args(["bench", "load"])
            .args(args)
            .status()?;
        ensure!(status.success(), "bench load failed");
        return Ok(());
    } else {
        // This is the optimised xtask the debug one started, from the same `--profile`.
        target_dir().join(&options.profile)
    };
    let baton = crate::pgo::measured_baton(options.pgo, &bins)?;
    let pinning = Pinning::plan(&procs::allowed_cpus());
    // Before the runtime starts, so every thread of the driver inherits the CPU set.
    if let Some(cpus) = &pinning.driver {
        procs::pin_self(cpus)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(drive(options, bins, baton, pinning))
}

/// Separate builds, not one: building packages together unifies their features and would
/// rebuild the dependencies `baton` shares with the others.
fn build(profile: &[&str]) -> anyhow::Result<()> {
    for package in [
        &["-p", "baton-server", "--bin", "baton"][..],
        &["-p", "baton-testkit", "--bin", "baton-mock"][..],
        &["-p", "baton-testkit", "--bin", "baton-floor"][..],
        &["-p", "xtask"][..],
    ] {
        cargo(&[&["build"], profile, package].concat())?;
    }
    Ok(())
}

fn cargo(args: &[&str]) -> anyhow::Result<()> {
    eprintln!("bench: cargo {}", args.join(" "));
    let status = crate::cargo_command()
        .current_dir(workspace_root())
        .args(args)
        .arg("--quiet")
        .status()?;
    ensure!(status.success(), "cargo {} failed", args.join(" "));
    Ok(())
}

async fn drive(
    mut options: Options,
    bins: PathBuf,
    baton: PathBuf,
    pinning: Pinning,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let bench_dir = target_dir().join("bench");
    std::fs::create_dir_all(&bench_dir)?;
    eprintln!("bench: {}", pinning.note);
    let mock_threads = *options.mock_threads.get_or_insert(pinning.mock_cpus);
    let (mock, mock_addr) = procs::start_mock(
        &bins,
        &procs::bench_mock_args(options.mock_delay_ms, mock_threads),
        pinning.mock.as_deref(),
    )?;
    let client = driver::client()?;
    // The direct long streams go to the mock's shaped route, as the gateways' do.
    let direct = Target::new(
        format!("http://{mock_addr}/v1/chat/completions"),
        format!("{}/chat/completions", procs::long_stream_base(&mock_addr)),
        None,
        "gpt-4o-mini",
        "gpt-4o-mini",
    );
    let baseline = Baseline::measure(&options, &client, &direct, mock.pid()).await?;
    let mut ctx = Context {
        options: options.clone(),
        client,
        clock_ticks: procs::clock_ticks_per_second(),
        direct,
        baseline,
        baton,
        mock_pid: mock.pid(),
    };

    let mut paths = Vec::new();
    for &gateway in &options.gateways {
        let result = run_one(&mut ctx, gateway, &bins, &bench_dir, &mock_addr, &pinning).await;
        match result {
            Ok(path) => paths.push(path),
            Err(error) => {
                let reason = format!("{error:#}");
                progress(gateway.name(), &format!("skipped: {reason}"));
                paths.push(json!({"name": gateway.name(), "skipped": reason}));
            }
        }
    }
    drop(mock);

    let mut report = report::assemble(&options, &pinning, &ctx.baseline, paths, started.elapsed());
    // `pgo --bolt` and `pgo` leave their binary in the same place; the JSON says which it was.
    report["options"]["bolt"] = json!(options.pgo && crate::pgo::is_bolted(&ctx.baton)?);
    let out_path = bench_dir.join("load.json");
    std::fs::write(&out_path, serde_json::to_string_pretty(&report)?)?;
    report::print(&report, &out_path)?;
    if options.smoke {
        report::smoke_checks(&report)?;
    }
    Ok(())
}

/// Baton's chat endpoint at `address` with the bench key: provider `openai` is the mock,
/// `mocklong` its long-stream route (`procs::start_baton`).
/// The model the bench's Baton sends to the fast mock (its `openai` provider).
pub(crate) const BENCH_MODEL: &str = "openai/gpt-4o-mini";

pub(crate) fn baton_target(address: &str) -> Target {
    let url = format!("http://{address}/api/v1/chat/completions");
    Target::new(
        url.clone(),
        url,
        Some(procs::BOOTSTRAP_KEY),
        BENCH_MODEL,
        "mocklong/gpt-4o-mini",
    )
}

/// Starts one gateway, runs the scenarios through it and stops it. An error here skips the
/// gateway (PostgreSQL unreachable, LiteLLM not installable) with its reason in the report.
async fn run_one(
    ctx: &mut Context,
    gateway: Gateway,
    bins: &Path,
    bench_dir: &Path,
    mock_addr: &str,
    pinning: &Pinning,
) -> anyhow::Result<Value> {
    let cpus = pinning.gateway.as_deref();
    let dir = TempDir::new(gateway.name())?;
    progress(gateway.name(), "starting");
    let sqlite = format!("sqlite://{}", dir.0.join("baton.db").display());
    let mut database = None;
    let baton = |database_url: &str, invocation_log: bool| {
        procs::start_baton(&BatonSpec {
            invocation_log,
            cpus,
            // The concurrent-streams phase measures the gateway, not the per-tenant abuse
            // limit (100 open streams by default): every stream is the bench tenant's.
            env: std::iter::once((
                "BATON_LIMITS__MAX_STREAMS_PER_TENANT".to_string(),
                (ctx.options.concurrent_streams + 10).to_string(),
            ))
            .chain(ctx.options.baton_env.iter().cloned())
            .collect(),
            program: ctx.baton.clone(),
            ..BatonSpec::new(bins, &dir.0, mock_addr, database_url)
        })
    };
    let (process, address) = match gateway {
        Gateway::Sqlite => baton(&sqlite, true)?,
        Gateway::NoLog => baton(&sqlite, false)?,
        Gateway::Postgres => {
            let created = procs::PgDatabase::create(&ctx.options.postgres_url)
                .context("PostgreSQL unreachable")?;
            let started = baton(&created.url, true)?;
            database = Some(created);
            started
        }
        Gateway::LiteLlm => procs::start_litellm(bench_dir, &dir.0, mock_addr, cpus)?,
        Gateway::Floor => procs::start_floor(bins, mock_addr, cpus)?,
    };
    let target = if gateway.is_baton() {
        baton_target(&address)
    } else if gateway == Gateway::Floor {
        // Forwards each path to the mock as it is, the shaped long-stream route included.
        let long_path = procs::long_stream_base(&address);
        Target::new(
            format!("http://{address}/v1/chat/completions"),
            format!("{long_path}/chat/completions"),
            None,
            "gpt-4o-mini",
            "gpt-4o-mini",
        )
    } else {
        let url = format!("http://{address}/v1/chat/completions");
        Target::new(
            url.clone(),
            url,
            Some("sk-bench"),
            "gpt-4o-mini",
            "gpt-4o-mini-long",
        )
    };
    let baton_addr = gateway.is_baton().then_some(address.as_str());
    let result = async {
        let flows = match baton_addr {
            Some(address) => Some(flows::set_up(&ctx.client, address).await?),
            None => None,
        };
        scenarios::run_gateway(
            ctx,
            gateway,
            &target,
            process.pid(),
            baton_addr,
            flows.as_ref(),
            database.as_ref(),
        )
        .await
    }
    .await;
    // The process stops before its database is dropped.
    drop(process);
    drop(database);
    result
}
