//! Command-line options of `cargo xtask bench load`.

use std::time::Duration;

use anyhow::{Context, bail, ensure};

pub const USAGE: &str =
    "usage: cargo xtask bench load [--smoke] [--duration SECS] [--sweep-duration SECS]
    [--rates N,N] [--sweep N,N,...] [--concurrency N] [--streams N] [--concurrent-streams N]
    [--mock-delay-ms MS] [--mock-threads N] [--gateways sqlite,postgres,nolog,floor] [--peer litellm] [--postgres-url URL]
    [--baton-env KEY=VALUE]... [--profile NAME] [--pgo]";

/// One way of serving the scenarios besides the direct path to the mock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gateway {
    /// Baton over SQLite, invocation logging on.
    Sqlite,
    /// Baton over a fresh PostgreSQL database, invocation logging on.
    Postgres,
    /// Baton over SQLite with `[invocation_log] enabled = false`.
    NoLog,
    /// LiteLLM's proxy (`--peer litellm`), one worker, no database.
    LiteLlm,
    /// The floor proxy (`baton-floor`): Baton's serving and provider-call stack doing nothing
    /// but forward, for what the extra hop itself costs on this machine.
    Floor,
}

impl Gateway {
    pub fn name(self) -> &'static str {
        match self {
            Gateway::Sqlite => "baton-sqlite",
            Gateway::Postgres => "baton-postgres",
            Gateway::NoLog => "baton-nolog",
            Gateway::LiteLlm => "litellm",
            Gateway::Floor => "floor",
        }
    }

    pub fn is_baton(self) -> bool {
        !matches!(self, Gateway::LiteLlm | Gateway::Floor)
    }

    /// Whether every request should leave one invocation-log row.
    pub fn logs(self) -> bool {
        matches!(self, Gateway::Sqlite | Gateway::Postgres)
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub smoke: bool,
    /// Length of each phase (concurrency 1, each fixed rate, concurrency N).
    pub duration: Duration,
    /// Length of each step of the rate sweep.
    pub sweep_duration: Duration,
    /// Open-loop fixed-rate phases, requests per second.
    pub rates: Vec<u64>,
    /// Rates of the sweep, tried in order until one fails.
    pub sweep: Vec<u64>,
    pub concurrency: usize,
    /// Streams read one after another (TTFT and inter-chunk gap).
    pub streams: usize,
    /// Streams opened all at once (long ones, so they overlap).
    pub concurrent_streams: usize,
    pub mock_delay_ms: u64,
    /// The mock's serving threads (`--mock-threads`); `None`: one per CPU it may run on (its
    /// pinned set, or every CPU when nothing is pinned), resolved when the run starts.
    pub mock_threads: Option<usize>,
    /// In the order they run; the peer comes last.
    pub gateways: Vec<Gateway>,
    /// An existing database to connect to for `CREATE DATABASE` / `DROP DATABASE`.
    pub postgres_url: String,
    /// More variables for every Baton gateway (`--baton-env`, repeatable): A/B runs of a
    /// setting or of the allocator's configuration without a rebuild.
    pub baton_env: Vec<(String, String)>,
    /// The Cargo profile Baton, the mock and the driver are built with (`--profile`): `release`
    /// for recorded figures, a quicker one to link (`release-check`: no LTO) for A/B runs.
    pub profile: String,
    /// Measure the profile-guided `baton` of `cargo xtask pgo` (`target/pgo/baton`) instead of
    /// the profile's.
    pub pgo: bool,
}

impl Options {
    pub fn parse(args: &[String]) -> anyhow::Result<Options> {
        let smoke = args.iter().any(|a| a == "--smoke");
        let mut options = if smoke {
            Options {
                smoke,
                duration: Duration::from_secs(1),
                sweep_duration: Duration::from_secs(1),
                rates: vec![100],
                sweep: Vec::new(),
                concurrency: 8,
                streams: 5,
                concurrent_streams: 50,
                mock_delay_ms: 0,
                mock_threads: None,
                gateways: vec![Gateway::Sqlite, Gateway::NoLog],
                postgres_url: DEFAULT_POSTGRES_URL.into(),
                baton_env: Vec::new(),
                profile: DEFAULT_PROFILE.into(),
                pgo: false,
            }
        } else {
            Options {
                smoke,
                duration: Duration::from_secs(5),
                sweep_duration: Duration::from_secs(3),
                rates: vec![1000, 5000],
                sweep: vec![250, 500, 1000, 2000, 3000, 5000, 8000, 12000, 16000, 20000],
                concurrency: 50,
                streams: 500,
                concurrent_streams: 1000,
                mock_delay_ms: 0,
                mock_threads: None,
                gateways: vec![Gateway::Sqlite, Gateway::Postgres, Gateway::NoLog],
                postgres_url: DEFAULT_POSTGRES_URL.into(),
                baton_env: Vec::new(),
                profile: DEFAULT_PROFILE.into(),
                pgo: false,
            }
        };
        let mut peer = false;
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let mut value = || {
                args.next()
                    .map(String::as_str)
                    .with_context(|| format!("{flag} needs a value\n{USAGE}"))
            };
            match flag.as_str() {
                "--smoke" => {}
                "--help" | "-h" => bail!("{USAGE}"),
                "--duration" => options.duration = seconds(flag, value()?)?,
                "--sweep-duration" => options.sweep_duration = seconds(flag, value()?)?,
                "--rates" => options.rates = list(flag, value()?)?,
                "--sweep" => options.sweep = list(flag, value()?)?,
                "--concurrency" => options.concurrency = number(flag, value()?)?.max(1) as usize,
                "--streams" => options.streams = number(flag, value()?)?.max(1) as usize,
                "--concurrent-streams" => {
                    options.concurrent_streams = number(flag, value()?)?.max(1) as usize;
                }
                "--mock-delay-ms" => options.mock_delay_ms = number(flag, value()?)?,
                "--mock-threads" => {
                    options.mock_threads = Some(number(flag, value()?)?.max(1) as usize);
                }
                "--gateways" => options.gateways = gateways(value()?)?,
                "--peer" => match value()? {
                    "litellm" => peer = true,
                    other => bail!("--peer: unknown peer '{other}' (only litellm)"),
                },
                "--postgres-url" => options.postgres_url = value()?.to_string(),
                "--profile" => options.profile = profile(value()?)?,
                "--pgo" => options.pgo = true,
                "--baton-env" => {
                    let pair = value()?;
                    let (key, value) = pair
                        .split_once('=')
                        .filter(|(key, _)| !key.is_empty())
                        .with_context(|| format!("--baton-env: '{pair}' is not KEY=VALUE"))?;
                    options.baton_env.push((key.to_string(), value.to_string()));
                }
                other => bail!("unknown option {other}\n{USAGE}"),
            }
        }
        ensure!(
            options.rates.iter().chain(&options.sweep).all(|&r| r > 0),
            "rates must be at least 1"
        );
        ensure!(
            !(options.pgo && options.smoke),
            "--pgo measures an optimised build; --smoke runs the dev builds"
        );
        if peer {
            options.gateways.push(Gateway::LiteLlm);
        }
        Ok(options)
    }
}

pub(crate) const DEFAULT_PROFILE: &str = "release";

/// A profile whose build lands in `target/<name>` and is optimised: Cargo's own `dev`, `test`
/// and `bench` are refused (the first two are unoptimised, and `dev` builds into `debug`).
pub(crate) fn profile(name: &str) -> anyhow::Result<String> {
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    ensure!(valid, "--profile: '{name}' is not a Cargo profile name");
    ensure!(
        !matches!(name, "dev" | "test" | "bench"),
        "--profile: '{name}' is not for measuring; use release or a profile that inherits it"
    );
    Ok(name.to_string())
}

const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn number(flag: &str, value: &str) -> anyhow::Result<u64> {
    value
        .parse()
        .with_context(|| format!("{flag}: '{value}' is not a whole number"))
}

fn seconds(flag: &str, value: &str) -> anyhow::Result<Duration> {
    Ok(Duration::from_secs(number(flag, value)?.max(1)))
}

fn list(flag: &str, value: &str) -> anyhow::Result<Vec<u64>> {
    value
        .split(',')
        .filter(|v| !v.trim().is_empty())
        .map(|v| number(flag, v.trim()))
        .collect()
}

fn gateways(value: &str) -> anyhow::Result<Vec<Gateway>> {
    let mut chosen = Vec::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let gateway = match name {
            "sqlite" => Gateway::Sqlite,
            "postgres" => Gateway::Postgres,
            "nolog" => Gateway::NoLog,
            "floor" => Gateway::Floor,
            other => bail!(
                "--gateways: unknown gateway '{other}' (sqlite, postgres, nolog, floor; the peer is --peer litellm)"
            ),
        };
        if !chosen.contains(&gateway) {
            chosen.push(gateway);
        }
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> anyhow::Result<Options> {
        Options::parse(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn defaults_smoke_and_lists() {
        let default = parse(&[]).unwrap();
        assert_eq!(default.rates, [1000, 5000]);
        assert_eq!(
            default.gateways,
            [Gateway::Sqlite, Gateway::Postgres, Gateway::NoLog]
        );
        let smoke = parse(&["--smoke", "--gateways", "sqlite"]).unwrap();
        assert!(smoke.smoke && smoke.sweep.is_empty());
        assert_eq!(smoke.gateways, [Gateway::Sqlite]);
        let peer = parse(&[
            "--gateways",
            "nolog,sqlite,floor",
            "--peer",
            "litellm",
            "--rates",
            "10,20",
        ])
        .unwrap();
        assert_eq!(
            peer.gateways,
            [
                Gateway::NoLog,
                Gateway::Sqlite,
                Gateway::Floor,
                Gateway::LiteLlm
            ]
        );
        assert!(!Gateway::Floor.is_baton() && !Gateway::Floor.logs());
        assert_eq!(peer.rates, [10, 20]);
        assert_eq!(default.profile, "release");
        let quick = parse(&["--profile", "release-check"]).unwrap();
        assert_eq!(quick.profile, "release-check");
        assert!(!default.pgo);
        assert!(parse(&["--pgo"]).unwrap().pgo);
        assert!(parse(&["--smoke", "--pgo"]).is_err());
        let env = parse(&[
            "--baton-env",
            "BATON_INVOCATION_LOG__BATCH_MAX_RUNS=32",
            "--baton-env",
            "_RJEM_MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1",
        ])
        .unwrap();
        assert_eq!(
            env.baton_env,
            [
                ("BATON_INVOCATION_LOG__BATCH_MAX_RUNS".into(), "32".into()),
                (
                    "_RJEM_MALLOC_CONF".into(),
                    "dirty_decay_ms:-1,muzzy_decay_ms:-1".into()
                ),
            ]
        );
    }

    #[test]
    fn bad_values_name_the_option() {
        let err = parse(&["--gateways", "mysql"]).unwrap_err().to_string();
        assert!(err.contains("--gateways") && err.contains("mysql"), "{err}");
        let err = parse(&["--rates", "1000,x"]).unwrap_err().to_string();
        assert!(err.contains("--rates"), "{err}");
        assert!(parse(&["--peer", "nginx"]).is_err());
        assert!(parse(&["--duration"]).is_err());
        for profile in ["dev", "../release", ""] {
            let err = parse(&["--profile", profile]).unwrap_err().to_string();
            assert!(err.contains("--profile"), "{profile}: {err}");
        }
        let err = parse(&["--baton-env", "=1"]).unwrap_err().to_string();
        assert!(
            err.contains("--baton-env") && err.contains("KEY=VALUE"),
            "{err}"
        );
    }
}
