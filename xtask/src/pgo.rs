//! `cargo xtask pgo`: a profile-guided build of `baton` (docs/performance.md, "Profile-guided
//! build").
//!
//! Baton's added latency at low rates is its code run cold: the request path is spread over
//! the binary, and each request after an idle gap refills caches and branch predictors. A
//! profile of real requests lets LLVM lay out hot code together, inline where calls are hot and
//! move cold paths out of the way. Steps, each in `target/pgo/`:
//!
//! 1. `baton` built with `-Cprofile-generate` (`instrumented/`), for the host target only, so
//!    build scripts and proc macros are not instrumented;
//! 2. a training load against the testkit's fast mock, as the load benchmark sends it: plain
//!    and streamed chat completions one at a time and concurrently, long streams, a few reads of
//!    the invocation log; once with the SQLite invocation log on and once with it off;
//! 3. `llvm-profdata merge` of the raw profiles into `baton.profdata`; the `llvm-profdata` must
//!    match rustc's LLVM (found on `PATH`, in `/usr/lib/llvm-N`, or rustup's `llvm-tools`;
//!    installed from Debian's `llvm-N` when missing and run as root);
//! 4. `baton` built with `-Cprofile-use` (`optimized/`), copied to `target/pgo/baton`.
//!
//! `cargo xtask bench load --pgo` and `cargo xtask bench instructions --pgo` measure that binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};

use crate::load::driver::{self, Target};
use crate::load::procs::{self, BatonSpec, TempDir};
use crate::load::{baton_target, target_dir, workspace_root};

const USAGE: &str = "usage: cargo xtask pgo [--requests N]";

/// Where the profile-guided `baton` is left.
pub(crate) fn baton_path() -> PathBuf {
    target_dir().join("pgo").join("baton")
}

/// The `baton` a benchmark measures: the profile-guided one when `pgo`, else the one among
/// `bins`; an error when it has not been built.
pub(crate) fn measured_baton(pgo: bool, bins: &Path) -> anyhow::Result<PathBuf> {
    let program = if pgo {
        baton_path()
    } else {
        bins.join("baton")
    };
    ensure!(
        program.exists(),
        "no {} (`cargo xtask pgo` builds the profile-guided one)",
        program.display()
    );
    Ok(program)
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let mut requests: u64 = 3_000;
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--requests" => {
                requests = args
                    .next()
                    .with_context(|| format!("--requests needs a value\n{USAGE}"))?
                    .parse()
                    .context("--requests")?;
            }
            "--help" | "-h" => bail!("{USAGE}"),
            other => bail!("unknown option {other:?}\n{USAGE}"),
        }
    }
    let rustc = Rustc::query()?;
    let profdata = llvm_profdata(rustc.llvm_major)?;
    let dir = target_dir().join("pgo");
    let raw = dir.join("profiles");
    // Profiles of an earlier build would describe other code.
    if raw.exists() {
        std::fs::remove_dir_all(&raw).with_context(|| format!("clearing {}", raw.display()))?;
    }
    std::fs::create_dir_all(&raw)?;

    eprintln!("pgo: building the mock and the instrumented baton");
    cargo_build(&["-p", "baton-testkit", "--bin", "baton-mock"], None, None)?;
    let instrumented = build_baton(
        &rustc.host,
        &dir.join("instrumented"),
        &format!("-Cprofile-generate={}", raw.display()),
    )?;

    eprintln!("pgo: training ({requests} requests a configuration)");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(train(&instrumented, &raw, requests))?;

    let merged = dir.join("baton.profdata");
    let mut profiles: Vec<PathBuf> = std::fs::read_dir(&raw)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "profraw"))
        .collect();
    profiles.sort();
    ensure!(
        !profiles.is_empty(),
        "the training runs wrote no profile into {}",
        raw.display()
    );
    let status = Command::new(&profdata)
        .arg("merge")
        .arg("-o")
        .arg(&merged)
        .args(&profiles)
        .status()
        .with_context(|| format!("running {}", profdata.display()))?;
    ensure!(status.success(), "llvm-profdata merge failed");

    eprintln!("pgo: building baton with the profile");
    let built = build_baton(
        &rustc.host,
        &dir.join("optimized"),
        &format!("-Cprofile-use={}", merged.display()),
    )?;
    std::fs::copy(&built, baton_path())
        .with_context(|| format!("copying {} to {}", built.display(), baton_path().display()))?;
    eprintln!("pgo: wrote {}", baton_path().display());
    Ok(())
}

/// What the toolchain says about itself (`rustc -vV`).
struct Rustc {
    host: String,
    llvm_major: u32,
}

impl Rustc {
    fn query() -> anyhow::Result<Rustc> {
        let output = Command::new("rustc")
            .arg("-vV")
            .current_dir(workspace_root())
            .output()
            .context("running rustc -vV")?;
        ensure!(output.status.success(), "rustc -vV failed");
        Rustc::parse(&String::from_utf8_lossy(&output.stdout))
    }

    fn parse(text: &str) -> anyhow::Result<Rustc> {
        let field = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name))
                .map(str::trim)
                .with_context(|| format!("rustc -vV printed no {name:?}"))
        };
        let host = field("host:")?.to_string();
        let llvm = field("LLVM version:")?;
        let llvm_major = llvm
            .split('.')
            .next()
            .and_then(|major| major.parse().ok())
            .with_context(|| format!("unreadable LLVM version {llvm:?}"))?;
        Ok(Rustc { host, llvm_major })
    }
}

/// An `llvm-profdata` of LLVM `major` (a profile written by one LLVM is read by the same
/// major version): `llvm-profdata-N` on `PATH`, Debian's `/usr/lib/llvm-N`, rustup's
/// `llvm-tools`; else Debian's `llvm-N` installed with apt when running as root.
fn llvm_profdata(major: u32) -> anyhow::Result<PathBuf> {
    let candidates = || {
        let mut found = vec![
            PathBuf::from(format!("llvm-profdata-{major}")),
            PathBuf::from(format!("/usr/lib/llvm-{major}/bin/llvm-profdata")),
        ];
        if let Ok(output) = Command::new("rustc").args(["--print", "sysroot"]).output() {
            let sysroot = String::from_utf8_lossy(&output.stdout).trim().to_string();
            if let Ok(entries) = std::fs::read_dir(Path::new(&sysroot).join("lib/rustlib")) {
                found.extend(
                    entries
                        .filter_map(Result::ok)
                        .map(|entry| entry.path().join("bin").join("llvm-profdata")),
                );
            }
        }
        found
    };
    let of_major = |path: &PathBuf| {
        Command::new(path)
            .arg("--version")
            .output()
            .ok()
            .filter(|output| output.status.success())
            .is_some_and(|output| {
                String::from_utf8_lossy(&output.stdout).contains(&format!("LLVM version {major}."))
            })
    };
    if let Some(found) = candidates().into_iter().find(of_major) {
        return Ok(found);
    }
    let package = format!("llvm-{major}");
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| String::from_utf8_lossy(&output.stdout).trim() == "0");
    ensure!(
        is_root && Path::new("/usr/bin/apt-get").exists(),
        "no llvm-profdata of LLVM {major} (rustc's): install Debian's `{package}` or rustup's \
         `llvm-tools` component"
    );
    eprintln!("pgo: installing {package} (llvm-profdata of rustc's LLVM {major})");
    let status = Command::new("apt-get")
        .args(["install", "-y", "-q", &package])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get")?;
    ensure!(status.success(), "apt-get install {package} failed");
    candidates()
        .into_iter()
        .find(of_major)
        .with_context(|| format!("{package} installed no llvm-profdata of LLVM {major}"))
}

/// `baton` built for `host` into `target_dir` with `rustflags`; the binary's path.
fn build_baton(host: &str, target_dir: &Path, rustflags: &str) -> anyhow::Result<PathBuf> {
    cargo_build(
        &["-p", "baton-server", "--bin", "baton", "--target", host],
        Some(target_dir),
        Some(rustflags),
    )?;
    Ok(target_dir.join(host).join("release").join("baton"))
}

/// `cargo build --release` of `package_args`, into `target_dir` when given, with `rustflags`
/// (which then apply to the `--target` crates only, not to build scripts).
fn cargo_build(
    package_args: &[&str],
    target_dir: Option<&Path>,
    rustflags: Option<&str>,
) -> anyhow::Result<()> {
    let mut command = crate::cargo_command();
    command
        .current_dir(workspace_root())
        .args(["build", "--release", "--quiet"])
        .args(package_args);
    if let Some(dir) = target_dir {
        command.arg("--target-dir").arg(dir);
    }
    if let Some(flags) = rustflags {
        command.env("RUSTFLAGS", flags);
    }
    let status = command.status().context("running cargo build")?;
    ensure!(
        status.success(),
        "cargo build {} failed",
        package_args.join(" ")
    );
    Ok(())
}

/// The training load: each configuration of the load benchmark's Baton (invocation log on
/// SQLite, and off), its profile written when it exits on `SIGTERM`.
async fn train(baton: &Path, raw: &Path, requests: u64) -> anyhow::Result<()> {
    let bins = target_dir().join("release");
    let (_mock, mock_addr) = procs::start_mock(&bins, &procs::bench_mock_args(0), None)?;
    let client = driver::client()?;
    for logged in [true, false] {
        let dir = TempDir::new("pgo")?;
        let database = format!("sqlite://{}", dir.0.join("baton.db").display());
        let (process, address) = procs::start_baton(&BatonSpec {
            program: baton.to_path_buf(),
            invocation_log: logged,
            env: vec![(
                // `%m` keeps the processes' files apart; `%p` too.
                "LLVM_PROFILE_FILE".into(),
                raw.join("baton-%p-%m.profraw").display().to_string(),
            )],
            ..BatonSpec::new(&bins, &dir.0, &mock_addr, &database)
        })?;
        let target = baton_target(&address);
        load(&client, &target, &address, logged, requests).await?;
        process.terminate(Duration::from_secs(120))?;
    }
    Ok(())
}

async fn load(
    client: &reqwest::Client,
    target: &Target,
    address: &str,
    logged: bool,
    requests: u64,
) -> anyhow::Result<()> {
    let sequential = driver::sequential(target, None, Some(requests)).await?;
    let concurrent = driver::concurrent(target, 8, Duration::from_secs(3)).await?;
    let streams = driver::streams(client, target, (requests / 10) as usize).await?;
    let long = driver::concurrent_streams(client, target, 50).await?;
    ensure!(
        sequential.errors == 0 && concurrent.errors == 0,
        "training requests failed: {}",
        sequential
            .first_error
            .or(concurrent.first_error)
            .unwrap_or_default()
    );
    ensure!(
        streams.ttft.errors == 0 && long.ttft.errors == 0,
        "training streams failed: {}",
        streams
            .ttft
            .first_error
            .or(long.ttft.first_error)
            .unwrap_or_default()
    );
    if logged {
        // Reading the log back is part of the load too (and the writer's last batch lands).
        let sent = sequential.sent + concurrent.sent + streams.ttft.sent + long.ttft.sent;
        driver::wait_for_log_rows(
            client,
            address,
            procs::BOOTSTRAP_KEY,
            sent,
            Duration::from_secs(60),
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustc_version_output_gives_the_host_and_llvm_major() {
        let text = "rustc 1.95.0 (59807616e 2026-04-14)\nbinary: rustc\nhost: x86_64-unknown-linux-gnu\nrelease: 1.95.0\nLLVM version: 22.1.2\n";
        let rustc = Rustc::parse(text).unwrap();
        assert_eq!(rustc.host, "x86_64-unknown-linux-gnu");
        assert_eq!(rustc.llvm_major, 22);
        assert!(Rustc::parse("rustc 1.95.0\nhost: x\n").is_err());
    }
}
