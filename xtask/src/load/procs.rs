//! The processes under test: the fast mock, Baton in each configuration, LiteLLM; their CPU time
//! and RSS from `/proc` (summed over the process tree: LiteLLM may fork); CPU pinning.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, LineWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use serde_json::Value;

pub const BOOTSTRAP_KEY: &str = "baton_bench_0123456789abcdef0123456789abcdef";
/// Shape of the streams opened all at once: long enough that they all overlap.
pub const LONG_CHUNKS: usize = 50;
pub const LONG_GAP_MS: u64 = 20;
/// Shape of the streams read one after another.
pub const SHORT_CHUNKS: usize = 20;
pub const SHORT_GAP_MS: u64 = 1;
const LITELLM_VERSION: &str = "1.100.5";

/// A process killed when dropped, so an early error leaves nothing running.
pub struct Guarded(pub Child);

impl Guarded {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Asks the process to stop (`SIGTERM`, so it shuts down as it would in production and a
    /// wrapper such as valgrind writes its results) and waits up to `limit` for it to exit.
    pub fn terminate(mut self, limit: Duration) -> anyhow::Result<()> {
        let status = Command::new("kill").arg(self.pid().to_string()).status()?;
        ensure!(status.success(), "kill {} failed", self.pid());
        let deadline = Instant::now() + limit;
        while self.0.try_wait()?.is_none() {
            ensure!(
                Instant::now() < deadline,
                "process {} still running {} s after SIGTERM",
                self.pid(),
                limit.as_secs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // LiteLLM's workers are its children: stop them first, so none is left behind.
        for pid in descendants(self.0.id()).into_iter().skip(1) {
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> anyhow::Result<TempDir> {
        let dir = std::env::temp_dir().join(format!("baton-xtask-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `cmd` started under `taskset -c CPUS` when pinning is on (taskset execs, so the pid is the
/// program's).
fn pinned(program: &Path, cpus: Option<&str>) -> Command {
    match cpus {
        Some(cpus) => {
            let mut command = Command::new("taskset");
            command.args(["-c", cpus]).arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// `baton-mock` with `args` (its flags), announcing its random port on its first line.
pub fn start_mock(
    bins: &Path,
    args: &[String],
    cpus: Option<&str>,
) -> anyhow::Result<(Guarded, String)> {
    announced(
        pinned(&bins.join("baton-mock"), cpus).args(args),
        "baton-mock",
    )
}

/// Spawns `command`, a testkit program that prints `listening ADDRESS` first.
fn announced(command: &mut Command, name: &str) -> anyhow::Result<(Guarded, String)> {
    let mut child = Guarded(
        command
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {name}"))?,
    );
    let stdout = child.0.stdout.take().context("stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let address = line
        .trim()
        .strip_prefix("listening ")
        .with_context(|| format!("unexpected first line from {name}: {line:?}"))?
        .to_string();
    Ok((child, address))
}

/// The floor proxy (`baton-floor`) in front of the mock, announcing its port as the mock does.
pub fn start_floor(
    bins: &Path,
    mock_addr: &str,
    cpus: Option<&str>,
) -> anyhow::Result<(Guarded, String)> {
    announced(
        pinned(&bins.join("baton-floor"), cpus)
            .args(["--upstream", &format!("http://{mock_addr}")]),
        "baton-floor",
    )
}

/// The load benchmark's mock flags: the provider delay, its serving threads and the
/// short-stream shape.
pub fn bench_mock_args(delay_ms: u64, threads: usize) -> Vec<String> {
    [
        ("--delay-ms", delay_ms),
        ("--threads", threads as u64),
        ("--chunks", SHORT_CHUNKS as u64),
        ("--gap-ms", SHORT_GAP_MS),
    ]
    .iter()
    .flat_map(|(flag, value)| [(*flag).to_string(), value.to_string()])
    .collect()
}

/// The mock's base URL for the long concurrent streams (its shaped route).
pub fn long_stream_base(mock_addr: &str) -> String {
    format!("http://{mock_addr}/shape/{LONG_CHUNKS}/{LONG_GAP_MS}/v1")
}

/// How to start Baton: [`start_baton`].
pub struct BatonSpec<'a> {
    /// Its working directory.
    pub dir: &'a Path,
    pub mock_addr: &'a str,
    pub database_url: &'a str,
    /// The `baton` binary: the one among the bench's binaries unless another build is
    /// measured (`--pgo`).
    pub program: PathBuf,
    /// The bootstrap API key (`BATON_BOOTSTRAP_API_KEY`).
    pub key: &'a str,
    pub invocation_log: bool,
    pub cpus: Option<&'a str>,
    /// Every line of Baton's stderr is copied here when set.
    pub log_file: Option<&'a Path>,
    /// More `BATON_*` variables (other providers, limits).
    pub env: Vec<(String, String)>,
    /// A program Baton runs under, with its arguments (`valgrind --tool=callgrind ...`); empty
    /// for none. Not combined with pinning.
    pub wrapper: Vec<String>,
}

impl<'a> BatonSpec<'a> {
    /// Baton on `database_url` with the bench key, the invocation log on, no pinning, no log
    /// file, no extra variables.
    pub fn new(
        bins: &'a Path,
        dir: &'a Path,
        mock_addr: &'a str,
        database_url: &'a str,
    ) -> BatonSpec<'a> {
        BatonSpec {
            dir,
            mock_addr,
            database_url,
            program: bins.join("baton"),
            key: BOOTSTRAP_KEY,
            invocation_log: true,
            cpus: None,
            log_file: None,
            env: Vec::new(),
            wrapper: Vec::new(),
        }
    }
}

/// Baton with its own environment only (the machine's provider keys and proxies must not leak
/// in), announcing its random port in its JSON log. Provider `openai` is the mock; provider
/// `mocklong` (an extra OpenAI-compatible one) is the mock's long-stream route.
pub fn start_baton(spec: &BatonSpec<'_>) -> anyhow::Result<(Guarded, String)> {
    let mock_addr = spec.mock_addr;
    let mut command = match spec.wrapper.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(&spec.program);
            command
        }
        None => pinned(&spec.program, spec.cpus),
    };
    command
        .args(["serve", "--bind", "127.0.0.1:0"])
        .current_dir(spec.dir)
        .env_clear()
        .env("BATON_DATABASE_URL", spec.database_url)
        .env("BATON_BOOTSTRAP_API_KEY", spec.key)
        .env(
            "BATON_PROVIDERS__OPENAI__BASE_URL",
            format!("http://{mock_addr}/v1"),
        )
        .env("BATON_PROVIDERS__OPENAI__API_KEY", "sk-bench")
        .env(
            "BATON_PROVIDERS__MOCKLONG__BASE_URL",
            long_stream_base(mock_addr),
        )
        .env("BATON_PROVIDERS__MOCKLONG__API_KEY", "sk-bench")
        .env(
            "BATON_INVOCATION_LOG__ENABLED",
            if spec.invocation_log { "true" } else { "false" },
        )
        .env("BATON_LOG_FORMAT", "json")
        .env("BATON_LOG", "warn,baton=info")
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(path) = std::env::var_os("PATH") {
        command.env("PATH", path);
    }
    let mut log = match spec.log_file {
        Some(path) => Some(LineWriter::new(
            File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => None,
    };
    let mut child = Guarded(command.spawn().context("starting baton")?);
    let stderr = child.0.stderr.take().context("baton stderr")?;
    let (found, address) = std::sync::mpsc::channel();
    // Keeps reading after the port line so a full pipe never blocks Baton's log writer.
    std::thread::spawn(move || {
        let mut found = Some(found);
        let mut before_start = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(log) = log.as_mut() {
                let _ = writeln!(log, "{line}");
            }
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

/// A fresh PostgreSQL database `baton_bench_<pid>`, dropped with this value.
pub struct PgDatabase {
    admin_url: String,
    name: String,
    pub url: String,
}

impl PgDatabase {
    /// Creates the database through `psql`; the error is the reason to skip PostgreSQL.
    pub fn create(admin_url: &str) -> anyhow::Result<PgDatabase> {
        let name = format!("baton_bench_{}", std::process::id());
        let (base, _) = admin_url
            .rsplit_once('/')
            .context("the PostgreSQL URL names no database")?;
        psql(admin_url, &format!("DROP DATABASE IF EXISTS \"{name}\""))?;
        psql(admin_url, &format!("CREATE DATABASE \"{name}\""))?;
        Ok(PgDatabase {
            admin_url: admin_url.to_string(),
            url: format!("{base}/{name}"),
            name,
        })
    }

    /// CPU ticks so far of each server process connected to this database (its backends:
    /// Baton's pool and its log writer's connections), by process id. Empty when `psql` or
    /// `/proc` cannot tell (a server on another machine, or another user's processes).
    pub fn backend_ticks(&self) -> HashMap<u32, u64> {
        let query = format!(
            "SELECT pid FROM pg_stat_activity WHERE datname = '{}'",
            self.name
        );
        let Ok(output) = Command::new("psql")
            .args([self.admin_url.as_str(), "-qAtc", query.as_str()])
            .stdin(Stdio::null())
            .output()
        else {
            return HashMap::new();
        };
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.trim().parse::<u32>().ok())
            .filter_map(|pid| Some((pid, own_cpu_ticks(pid)?)))
            .collect()
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let _ = psql(
            &self.admin_url,
            &format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name),
        );
    }
}

fn psql(url: &str, statement: &str) -> anyhow::Result<()> {
    let output = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qAtc", statement])
        .stdin(Stdio::null())
        .output()
        .context("psql is not installed")?;
    ensure!(
        output.status.success(),
        "psql {url}: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

/// The venv with `litellm[proxy]` at the pinned version, created on first use.
fn litellm_venv(root: &Path) -> anyhow::Result<PathBuf> {
    let venv = root.join("litellm-venv");
    let python = venv.join("bin").join("python");
    let installed = Command::new(&python)
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('litellm'))",
        ])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string());
    if installed.as_deref() == Some(LITELLM_VERSION) && venv.join("bin/litellm").exists() {
        return Ok(venv);
    }
    eprintln!(
        "bench: installing litellm[proxy]=={LITELLM_VERSION} into {} (once)",
        venv.display()
    );
    if !python.exists() {
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .context("python3 -m venv")?;
        ensure!(
            status.success(),
            "python3 -m venv {} failed",
            venv.display()
        );
    }
    let status = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet"])
        .arg(format!("litellm[proxy]=={LITELLM_VERSION}"))
        .status()
        .context("pip install litellm")?;
    ensure!(status.success(), "pip install litellm[proxy] failed");
    Ok(venv)
}

/// LiteLLM's proxy on a free port, one worker, no database, models `gpt-4o-mini` (the mock) and
/// `gpt-4o-mini-long` (the mock's long-stream route).
pub fn start_litellm(
    bench_dir: &Path,
    dir: &Path,
    mock_addr: &str,
    cpus: Option<&str>,
) -> anyhow::Result<(Guarded, String)> {
    let venv = litellm_venv(bench_dir)?;
    let config = dir.join("litellm.yaml");
    std::fs::write(
        &config,
        format!(
            "model_list:
  - model_name: gpt-4o-mini
    litellm_params:
      model: openai/gpt-4o-mini
      api_base: http://{mock_addr}/v1
      api_key: sk-bench
  - model_name: gpt-4o-mini-long
    litellm_params:
      model: openai/gpt-4o-mini
      api_base: {}
      api_key: sk-bench
",
            long_stream_base(mock_addr)
        ),
    )?;
    // Another process could take the port between this check and LiteLLM's bind; unlikely on
    // loopback and it would only fail the start.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let log = std::fs::File::create(dir.join("litellm.log"))?;
    let mut command = pinned(&venv.join("bin/litellm"), cpus);
    command
        .arg("--config")
        .arg(&config)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--num_workers", "1"])
        .current_dir(dir)
        .env_clear()
        .env("HOME", dir)
        // Loopback only: the shipped model-cost map instead of fetching it at start.
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("LITELLM_TELEMETRY", "False")
        .stdout(log.try_clone()?)
        .stderr(log);
    if let Ok(path) = std::env::var("PATH") {
        command.env("PATH", format!("{}:{path}", venv.join("bin").display()));
    }
    let mut child = Guarded(command.spawn().context("starting litellm")?);
    let address = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if let Some(status) = child.0.try_wait()? {
            let log = std::fs::read_to_string(dir.join("litellm.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            bail!(
                "litellm exited ({status}) before it was healthy:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        let healthy = std::net::TcpStream::connect(&address).is_ok_and(|mut stream| {
            use std::io::{Read, Write};
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let request = format!(
                "GET /health/liveliness HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
            );
            let mut response = String::new();
            stream.write_all(request.as_bytes()).is_ok()
                && stream.read_to_string(&mut response).is_ok()
                && response.starts_with("HTTP/1.1 200")
        });
        if healthy {
            return Ok((child, address));
        }
        ensure!(
            Instant::now() < deadline,
            "litellm was not healthy within 180 s (log: {})",
            dir.join("litellm.log").display()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `root` and every process below it, root first.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(ppid) = stat_fields(pid).and_then(|f| f.get(1)?.parse::<u32>().ok()) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut all = vec![root];
    let mut next = 0;
    while next < all.len() {
        if let Some(kids) = children.get(&all[next]) {
            all.extend(kids);
        }
        next += 1;
    }
    all
}

/// Fields of `/proc/PID/stat` after the command name, starting at field 3 (state).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it start past the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// User plus system CPU time of the tree in clock ticks (fields 14 and 15 of `/proc/PID/stat`).
pub fn cpu_ticks(root: u32) -> u64 {
    descendants(root)
        .into_iter()
        .filter_map(own_cpu_ticks)
        .sum()
}

/// User plus system CPU time of one process in clock ticks.
fn own_cpu_ticks(pid: u32) -> Option<u64> {
    let fields = stat_fields(pid)?;
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

pub fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(100)
}

fn rss_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// `VmRSS` of the tree, in kB.
pub fn rss_kb(root: u32) -> u64 {
    descendants(root).into_iter().filter_map(rss_of).sum()
}

/// Samples between which the sampler looks for the tree's processes again.
const SAMPLES_PER_TREE_SCAN: u32 = 50;

/// Samples the tree's RSS every 100 ms on its own thread. Finding the tree reads every
/// process's `stat` (~1.5 ms of a CPU with this machine's ~140 processes): done on every sample
/// it kept one CPU busy 1.5% of the time, in bursts a request waiting behind it counted in
/// its latency (a p99 figure sees that), so the tree is found again only every
/// [`SAMPLES_PER_TREE_SCAN`] samples, or when one of its processes has gone.
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
}

impl RssSampler {
    pub fn start(pid: u32) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let (stop_flag, peak_kb) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            let mut tree = descendants(pid);
            let mut samples = 0u32;
            while !stop_flag.load(Ordering::Relaxed) {
                let sizes: Vec<Option<u64>> = tree.iter().map(|&p| rss_of(p)).collect();
                peak_kb.fetch_max(sizes.iter().flatten().sum(), Ordering::Relaxed);
                samples += 1;
                if samples.is_multiple_of(SAMPLES_PER_TREE_SCAN) || sizes.contains(&None) {
                    tree = descendants(pid);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        RssSampler { stop, peak }
    }

    /// The peak since the start or the last `take_peak`, sampled once more now.
    pub fn take_peak(&self, pid: u32) -> u64 {
        self.peak.fetch_max(rss_kb(pid), Ordering::Relaxed);
        self.peak.swap(0, Ordering::Relaxed)
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Which CPUs each party gets: disjoint sets when there are at least four, else none.
#[derive(Debug, Clone)]
pub struct Pinning {
    pub gateway: Option<String>,
    pub mock: Option<String>,
    pub driver: Option<String>,
    /// How many CPUs the mock may run on: its pinned set, or all of them.
    pub mock_cpus: usize,
    pub note: String,
}

impl Pinning {
    pub fn plan(cpus: &[usize]) -> Pinning {
        let join = |set: &[usize]| {
            set.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        if cpus.len() < 4 || Command::new("taskset").arg("-V").output().is_err() {
            return Pinning {
                gateway: None,
                mock: None,
                driver: None,
                mock_cpus: cpus.len().max(1),
                note: format!(
                    "not pinned: {} CPUs (pinning needs 4 and taskset); the gateway, the mock and the driver share them",
                    cpus.len()
                ),
            };
        }
        // Half for the gateway (what is measured), a quarter each for the mock and the driver.
        let half = cpus.len() / 2;
        let quarter = (cpus.len() / 4).max(1);
        let (gateway, rest) = cpus.split_at(half);
        let (mock, driver) = rest.split_at(quarter);
        Pinning {
            note: format!(
                "pinned with taskset: gateway CPUs {}, mock {}, driver {}",
                join(gateway),
                join(mock),
                join(driver)
            ),
            gateway: Some(join(gateway)),
            mock: Some(join(mock)),
            driver: Some(join(driver)),
            mock_cpus: mock.len(),
        }
    }
}

/// The CPUs this process may run on (`Cpus_allowed_list` of `/proc/self/status`).
pub fn allowed_cpus() -> Vec<usize> {
    let list = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_default();
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    cpus.extend(a..=b);
                }
            }
            None => cpus.extend(part.parse::<usize>().ok()),
        }
    }
    if cpus.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, usize::from);
        cpus.extend(0..n);
    }
    cpus
}

/// Pins this process (called before the runtime starts, so every thread inherits it).
pub fn pin_self(cpus: &str) -> anyhow::Result<()> {
    let status = Command::new("taskset")
        .args(["-p", "-c", cpus, &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status()?;
    ensure!(status.success(), "taskset -p -c {cpus} failed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_splits_disjoint_sets_from_four_cpus() {
        assert!(Pinning::plan(&[0, 1]).gateway.is_none());
        if Command::new("taskset").arg("-V").output().is_err() {
            return;
        }
        let four = Pinning::plan(&[0, 1, 2, 3]);
        assert_eq!(four.gateway.as_deref(), Some("0,1"));
        assert_eq!(four.mock.as_deref(), Some("2"));
        assert_eq!(four.driver.as_deref(), Some("3"));
        let eight = Pinning::plan(&(0..8).collect::<Vec<_>>());
        assert_eq!(eight.gateway.as_deref(), Some("0,1,2,3"));
        assert_eq!(eight.mock.as_deref(), Some("4,5"));
        assert_eq!(eight.driver.as_deref(), Some("6,7"));
    }

    #[test]
    fn this_process_is_its_own_tree_with_cpu_and_rss() {
        let me = std::process::id();
        assert_eq!(descendants(me)[0], me);
        assert!(rss_kb(me) > 0);
        assert!(!allowed_cpus().is_empty());
    }
}
