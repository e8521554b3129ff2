//! `cargo xtask fuzz [--seconds N] [--dev] [TARGET...]`: runs the cargo-fuzz targets of `fuzz/` for a
//! bounded time each (docs/reliability.md, "Fuzzing").
//!
//! The toolchain is stable, so the targets are built without a sanitizer (`--sanitizer none`:
//! the address sanitizer needs nightly's `-Zsanitizer`) and with debug assertions and overflow
//! checks on (`-a`); libFuzzer's coverage instrumentation uses stable `-C` flags. cargo-fuzz
//! itself is installed from crates.io into `target/tools` (a path CI can cache) when missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail, ensure};

/// The cargo-fuzz release the task installs; `--locked` takes its own lock file.
const CARGO_FUZZ_VERSION: &str = "0.13.2";
const DEFAULT_SECONDS: u64 = 60;

struct Options {
    seconds: u64,
    /// Unoptimised build (`cargo fuzz --dev`): compiles in a fraction of the time, fuzzes
    /// slower; CI's short run uses it.
    dev: bool,
    targets: Vec<String>,
}

impl Options {
    /// The flags `cargo fuzz build` and `cargo fuzz run` share (the same build for both).
    fn build_flags(&self) -> Vec<&'static str> {
        let mut flags = vec!["--sanitizer", "none", "-a"];
        if self.dev {
            flags.push("--dev");
        }
        flags
    }
}

fn parse(args: &[String]) -> anyhow::Result<Options> {
    let mut options = Options {
        seconds: DEFAULT_SECONDS,
        dev: false,
        targets: Vec::new(),
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                let value = args.next().context("--seconds needs a number")?;
                options.seconds = value
                    .parse()
                    .with_context(|| format!("--seconds: '{value}' is not a whole number"))?;
                ensure!(options.seconds > 0, "--seconds must be at least 1");
            }
            "--dev" => options.dev = true,
            flag if flag.starts_with('-') => bail!("unknown option '{flag}'"),
            target => options.targets.push(target.to_owned()),
        }
    }
    Ok(options)
}

/// What one target's run came to.
struct Outcome {
    target: String,
    runs: Option<u64>,
    seconds: f64,
    corpus: usize,
    crash: Option<PathBuf>,
    failed: bool,
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let options = parse(args)?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("xtask has no parent directory")?
        .to_path_buf();
    let fuzz_dir = root.join("fuzz");
    let available = targets(&fuzz_dir)?;
    let chosen = if options.targets.is_empty() {
        available.clone()
    } else {
        for target in &options.targets {
            ensure!(
                available.contains(target),
                "no fuzz target '{target}'; there are: {}",
                available.join(", ")
            );
        }
        options.targets.clone()
    };

    let cargo_fuzz = install(&root)?;
    let path = std::env::join_paths(
        std::iter::once(cargo_fuzz.parent().unwrap_or(&root).to_path_buf()).chain(
            std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .unwrap_or_default(),
        ),
    )?;

    eprintln!("== building {} fuzz target(s)", chosen.len());
    let started = Instant::now();
    let mut build = Command::new(&cargo_fuzz);
    crate::without_run_variables(&mut build);
    build
        .current_dir(&root)
        .env("PATH", &path)
        .args(["fuzz", "build"])
        .args(options.build_flags());
    if chosen.len() == 1 {
        build.args(&chosen);
    }
    let status = build.status().context("running cargo fuzz build")?;
    ensure!(status.success(), "cargo fuzz build failed");
    eprintln!("   built in {:.0} s", started.elapsed().as_secs_f64());

    let logs = fuzz_dir.join("target").join("logs");
    std::fs::create_dir_all(&logs)?;
    let mut outcomes = Vec::new();
    for target in &chosen {
        eprintln!("== fuzzing {target} for {} s", options.seconds);
        outcomes.push(fuzz_one(
            &cargo_fuzz,
            &path,
            &root,
            target,
            &options,
            &logs,
        )?);
    }

    eprintln!(
        "\n{:<26} {:>12} {:>8} {:>10} {:>8}  result",
        "target", "runs", "seconds", "runs/s", "corpus"
    );
    for o in &outcomes {
        let runs = o.runs.map_or("?".to_owned(), |r| r.to_string());
        let rate = o.runs.map_or("?".to_owned(), |r| {
            format!("{:.0}", r as f64 / o.seconds.max(0.001))
        });
        let result = match (&o.crash, o.failed) {
            (Some(path), _) => format!("CRASH {}", path.display()),
            (None, true) => "FAILED (see log)".to_owned(),
            (None, false) => "ok".to_owned(),
        };
        eprintln!(
            "{:<26} {runs:>12} {:>8.0} {rate:>10} {:>8}  {result}",
            o.target, o.seconds, o.corpus
        );
    }
    let failures: Vec<&Outcome> = outcomes.iter().filter(|o| o.failed).collect();
    if failures.is_empty() {
        return Ok(());
    }
    for o in &failures {
        eprintln!(
            "\n{} failed; log: {}",
            o.target,
            logs.join(format!("{}.log", o.target)).display()
        );
        if let Some(crash) = &o.crash {
            eprintln!(
                "reproduce: {} fuzz run {} {} {}",
                cargo_fuzz.display(),
                options.build_flags().join(" "),
                o.target,
                crash.display()
            );
        }
    }
    bail!("{} fuzz target(s) failed", failures.len())
}

/// The `[[bin]]` targets of `fuzz/fuzz_targets`, by file name.
fn targets(fuzz_dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(fuzz_dir.join("fuzz_targets"))
        .context("reading fuzz/fuzz_targets")?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            name.strip_suffix(".rs").map(str::to_owned)
        })
        .collect();
    names.sort();
    Ok(names)
}

/// cargo-fuzz from `target/tools/bin`, installed there first if missing.
fn install(root: &Path) -> anyhow::Result<PathBuf> {
    let tools = root.join("target").join("tools");
    let binary = tools.join("bin").join("cargo-fuzz");
    if binary.exists() {
        return Ok(binary);
    }
    eprintln!(
        "== installing cargo-fuzz {CARGO_FUZZ_VERSION} into {}",
        tools.display()
    );
    let status = crate::cargo_command()
        .args([
            "install",
            "cargo-fuzz",
            "--locked",
            "--version",
            CARGO_FUZZ_VERSION,
            // It only runs cargo: unoptimised, it installs in half the time (~25 s on 2 cores).
            "--debug",
            "--root",
        ])
        .arg(&tools)
        .status()
        .context("running cargo install")?;
    ensure!(status.success(), "installing cargo-fuzz failed");
    Ok(binary)
}

fn fuzz_one(
    cargo_fuzz: &Path,
    path: &std::ffi::OsStr,
    root: &Path,
    target: &str,
    options: &Options,
    logs: &Path,
) -> anyhow::Result<Outcome> {
    let seconds = options.seconds;
    let fuzz_dir = root.join("fuzz");
    // The working corpus grows across runs (ignored by git); the committed seeds are read too.
    let corpus = fuzz_dir.join("corpus").join(target);
    let seeds = fuzz_dir.join("seeds").join(target);
    let artifacts = fuzz_dir.join("artifacts").join(target);
    std::fs::create_dir_all(&corpus)?;
    std::fs::create_dir_all(&artifacts)?;
    let before = files(&artifacts);
    let log_path = logs.join(format!("{target}.log"));
    let log = std::fs::File::create(&log_path)?;

    let mut command = Command::new(cargo_fuzz);
    crate::without_run_variables(&mut command);
    command
        .current_dir(root)
        .env("PATH", path)
        .args(["fuzz", "run"])
        .args(options.build_flags())
        .arg(target)
        .arg(&corpus);
    if seeds.is_dir() {
        command.arg(&seeds);
    }
    command
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        // A case slower than this is a finding (a render that blows up, a parser gone
        // quadratic), not something to wait for.
        .arg("-timeout=10")
        .arg("-rss_limit_mb=2048")
        .arg("-max_len=8192")
        .arg("-print_final_stats=1")
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log));
    let started = Instant::now();
    let status = command.status().context("running cargo fuzz run")?;
    let elapsed = started.elapsed().as_secs_f64();

    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let runs = text
        .lines()
        .find_map(|line| line.strip_prefix("stat::number_of_executed_units:"))
        .and_then(|n| n.trim().parse().ok());
    let crash = files(&artifacts)
        .into_iter()
        .filter(|file| !before.contains(file))
        .max_by_key(|file| std::fs::metadata(file).and_then(|m| m.modified()).ok());
    if !status.success() {
        // The panic message (the broken invariant) or libFuzzer's own report, else the end.
        let lines: Vec<&str> = text.lines().collect();
        let from = lines
            .iter()
            .position(|line| line.contains("panicked at") || line.contains("ERROR: libFuzzer"))
            .unwrap_or(lines.len().saturating_sub(30));
        for line in lines.iter().skip(from).take(12) {
            eprintln!("   {line}");
        }
    }
    Ok(Outcome {
        target: target.to_owned(),
        runs,
        seconds: elapsed,
        corpus: files(&corpus).len(),
        crash,
        failed: !status.success(),
    })
}

fn files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default()
}
