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
//! 2. a training load against the testkit's fast mock: what the load benchmark sends (plain
//!    and streamed chat completions one at a time and concurrently, long streams), then flow
//!    runs, streamed flow runs, agent trees and chat requests offering tools (`training.rs`:
//!    code a profile never saw is laid out as cold), and a few reads of the invocation log;
//!    once with the SQLite invocation log on and once with it off;
//! 3. `llvm-profdata merge` of the raw profiles into `baton.profdata`; the `llvm-profdata` must
//!    match rustc's LLVM (found on `PATH`, in `/usr/lib/llvm-N`, or rustup's `llvm-tools`;
//!    installed from Debian's `llvm-N` when missing and run as root);
//! 4. `baton` built with `-Cprofile-use` (`optimized/`), copied to `target/pgo/baton`.
//!
//! With `--bolt`, step 4 links with relocations kept (`--emit-relocs`), and BOLT lays out that
//! binary's machine code once more after linking, from a profile of its own:
//!
//! 5. `llvm-bolt -instrument` of the profile-guided binary (`bolt/baton-instrumented`), the same
//!    training load again, the per-process profiles merged with `merge-fdata`;
//! 6. `llvm-bolt` with that profile: basic blocks reordered within functions, hot functions
//!    placed together, cold blocks split out, identical functions folded; the result is
//!    `target/pgo/baton`, and the profile-guided binary alone stays as `target/pgo/baton-pgo`
//!    for comparison. BOLT comes from Debian's `bolt-N` of rustc's LLVM (installed when missing
//!    and run as root).
//!
//! `cargo xtask bench load --pgo` and `cargo xtask bench instructions --pgo` measure
//! `target/pgo/baton`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};

use crate::load::driver::{self, Target};
use crate::load::procs::{self, BatonSpec, TempDir};
use crate::load::{baton_target, target_dir, workspace_root};

mod training;

const USAGE: &str = "usage: cargo xtask pgo [--requests N] [--bolt]";

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
    let mut bolt = false;
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
            "--bolt" => bolt = true,
            "--help" | "-h" => bail!("{USAGE}"),
            other => bail!("unknown option {other:?}\n{USAGE}"),
        }
    }
    let rustc = Rustc::query()?;
    let profdata = llvm_tool(&LLVM_PROFDATA, rustc.llvm_major)?;
    // Found before the long builds, so a missing BOLT fails at once.
    let bolt_tools = if bolt {
        Some((
            llvm_tool(&LLVM_BOLT, rustc.llvm_major)?,
            llvm_tool(&MERGE_FDATA, rustc.llvm_major)?,
        ))
    } else {
        None
    };
    let dir = target_dir().join("pgo");
    let raw = dir.join("profiles");
    // Profiles of an earlier build would describe other code.
    empty_dir(&raw)?;

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
    // `%m` keeps the processes' files apart; `%p` too.
    let profile_file = raw.join("baton-%p-%m.profraw").display().to_string();
    runtime.block_on(train(
        &instrumented,
        &[("LLVM_PROFILE_FILE", profile_file)],
        requests,
    ))?;

    let merged = dir.join("baton.profdata");
    let profiles = profiles_in(&raw, |name| name.ends_with(".profraw"))?;
    run_tool(
        Command::new(&profdata)
            .arg("merge")
            .arg("-o")
            .arg(&merged)
            .args(&profiles),
    )?;

    eprintln!("pgo: building baton with the profile");
    let mut rustflags = format!("-Cprofile-use={}", merged.display());
    if bolt_tools.is_some() {
        // BOLT moves functions only in a binary that kept its relocations.
        rustflags.push_str(" -Clink-arg=-Wl,--emit-relocs");
    }
    let built = build_baton(&rustc.host, &dir.join("optimized"), &rustflags)?;
    match bolt_tools {
        Some((llvm_bolt, merge_fdata)) => {
            let profile_guided = dir.join("baton-pgo");
            copy(&built, &profile_guided)?;
            runtime.block_on(bolt_optimize(
                &profile_guided,
                &dir.join("bolt"),
                &llvm_bolt,
                &merge_fdata,
                requests,
            ))?;
        }
        None => {
            copy(&built, &baton_path())?;
            // An earlier `--bolt` run's profile-guided binary describes an earlier build.
            remove_if_present(&dir.join("baton-pgo"))?;
        }
    }
    eprintln!("pgo: wrote {}", baton_path().display());
    Ok(())
}

/// Whether `binary` was rewritten by BOLT, which names a section of its own in every binary
/// it writes (`.note.bolt_info`).
pub(crate) fn is_bolted(binary: &Path) -> anyhow::Result<bool> {
    let bytes = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    Ok(contains(&bytes, b".note.bolt_info"))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// `dir`, created empty (what an earlier run left there removed).
fn empty_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// The profiles the training wrote into `dir` (files whose name `is_profile`), sorted; an
/// error when there are none.
fn profiles_in(dir: &Path, is_profile: impl Fn(&str) -> bool) -> anyhow::Result<Vec<PathBuf>> {
    let mut profiles: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(&is_profile)
        })
        .collect();
    profiles.sort();
    ensure!(
        !profiles.is_empty(),
        "the training runs wrote no profile into {}",
        dir.display()
    );
    Ok(profiles)
}

fn remove_if_present(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(error).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

fn copy(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// Steps 5 and 6: BOLT's instrumented `profile_guided`, trained in `work`, then the optimised
/// binary written to `baton_path()`.
async fn bolt_optimize(
    profile_guided: &Path,
    work: &Path,
    llvm_bolt: &Path,
    merge_fdata: &Path,
    requests: u64,
) -> anyhow::Result<()> {
    empty_dir(work)?;
    let instrumented = work.join("baton-instrumented");
    let prefix = work.join("prof.fdata");
    eprintln!("pgo: instrumenting the profile-guided baton with BOLT");
    run_tool(
        Command::new(llvm_bolt)
            .arg(profile_guided)
            .arg("-instrument")
            .arg(format!("--instrumentation-file={}", prefix.display()))
            // Each process writes its own file (`prof.fdata.<pid>.fdata`), merged below.
            .arg("--instrumentation-file-append-pid")
            .arg("-o")
            .arg(&instrumented),
    )?;

    eprintln!("pgo: training the BOLT-instrumented baton ({requests} requests a configuration)");
    train(&instrumented, &[], requests).await?;
    let profiles = profiles_in(work, |name| name.starts_with("prof.fdata."))?;
    let merged = work.join("baton.fdata");
    run_tool(
        Command::new(merge_fdata)
            .args(&profiles)
            .arg("-o")
            .arg(&merged),
    )?;

    eprintln!("pgo: optimising the layout with BOLT");
    run_tool(
        Command::new(llvm_bolt)
            .arg(profile_guided)
            .arg("-o")
            .arg(baton_path())
            .arg(format!("-data={}", merged.display()))
            // The options rustc's own release build uses (src/tools/opt-dist/src/bolt.rs).
            .args([
                "-reorder-blocks=ext-tsp",
                "-reorder-functions=cdsort",
                "-split-functions",
                "-split-strategy=cdsplit",
                "-split-all-cold",
                "-jump-tables=move",
                "-icf=all",
                "-dyno-stats",
            ]),
    )
}

/// Runs an LLVM tool, its output shown only when it fails (BOLT prints pages of statistics).
fn run_tool(command: &mut Command) -> anyhow::Result<()> {
    let output = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    ensure!(
        output.status.success(),
        "{command:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
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

/// An LLVM tool the build needs, and where it comes from.
struct LlvmTool {
    /// Its name in `/usr/lib/llvm-N/bin` (and, with `-N` appended, on `PATH`).
    name: &'static str,
    /// Debian's package of it, with `-N` appended.
    package: &'static str,
    /// Whether rustup's `llvm-tools` component has it.
    in_rustup: bool,
}

const LLVM_PROFDATA: LlvmTool = LlvmTool {
    name: "llvm-profdata",
    package: "llvm",
    in_rustup: true,
};
const LLVM_BOLT: LlvmTool = LlvmTool {
    name: "llvm-bolt",
    package: "bolt",
    in_rustup: false,
};
const MERGE_FDATA: LlvmTool = LlvmTool {
    name: "merge-fdata",
    package: "bolt",
    in_rustup: false,
};

/// `tool` of LLVM `major` (a profile written by one LLVM is read by the same major version):
/// `NAME-N` on `PATH`, Debian's `/usr/lib/llvm-N`, rustup's `llvm-tools`; else Debian's
/// package installed with apt when running as root.
fn llvm_tool(tool: &LlvmTool, major: u32) -> anyhow::Result<PathBuf> {
    let name = tool.name;
    let candidates = || {
        let mut found = vec![
            PathBuf::from(format!("{name}-{major}")),
            PathBuf::from(format!("/usr/lib/llvm-{major}/bin/{name}")),
        ];
        if !tool.in_rustup {
            return found;
        }
        if let Ok(output) = Command::new("rustc").args(["--print", "sysroot"]).output() {
            let sysroot = String::from_utf8_lossy(&output.stdout).trim().to_string();
            if let Ok(entries) = std::fs::read_dir(Path::new(&sysroot).join("lib/rustlib")) {
                found.extend(
                    entries
                        .filter_map(Result::ok)
                        .map(|entry| entry.path().join("bin").join(name)),
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
    let package = format!("{}-{major}", tool.package);
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| String::from_utf8_lossy(&output.stdout).trim() == "0");
    let rustup_hint = if tool.in_rustup {
        " or rustup's `llvm-tools` component"
    } else {
        ""
    };
    ensure!(
        is_root && Path::new("/usr/bin/apt-get").exists(),
        "no {name} of LLVM {major} (rustc's): install Debian's `{package}`{rustup_hint}"
    );
    eprintln!("pgo: installing {package} ({name} of rustc's LLVM {major})");
    let status = Command::new("apt-get")
        .args(["install", "-y", "-q", &package])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get")?;
    ensure!(status.success(), "apt-get install {package} failed");
    candidates()
        .into_iter()
        .find(of_major)
        .with_context(|| format!("{package} installed no {name} of LLVM {major}"))
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
/// SQLite, and off), run with `env`, its profile written when it exits on `SIGTERM`.
async fn train(baton: &Path, env: &[(&str, String)], requests: u64) -> anyhow::Result<()> {
    let bins = target_dir().join("release");
    let (_mock, mock_addr) = procs::start_mock(&bins, &procs::bench_mock_args(0, 1), None)?;
    let client = driver::client()?;
    for logged in [true, false] {
        let dir = TempDir::new("pgo")?;
        let database = format!("sqlite://{}", dir.0.join("baton.db").display());
        let (process, address) = procs::start_baton(&BatonSpec {
            program: baton.to_path_buf(),
            invocation_log: logged,
            env: env
                .iter()
                .map(|(name, value)| ((*name).into(), value.clone()))
                .collect(),
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
    let product_rows = training::flows_and_tools(client, address, requests).await?;
    if logged {
        // Reading the log back is part of the load too (and the writer's last batch lands).
        let sent =
            sequential.sent + concurrent.sent + streams.ttft.sent + long.ttft.sent + product_rows;
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

    #[test]
    fn profiles_are_the_matching_files_sorted_and_none_is_an_error() {
        let dir = TempDir::new("profiles").unwrap();
        for name in [
            "b.profraw",
            "a.profraw",
            "baton.profdata",
            "prof.fdata.7.fdata",
        ] {
            std::fs::write(dir.0.join(name), b"").unwrap();
        }
        let raw = profiles_in(&dir.0, |name| name.ends_with(".profraw")).unwrap();
        assert_eq!(raw, [dir.0.join("a.profraw"), dir.0.join("b.profraw")]);
        let bolt = profiles_in(&dir.0, |name| name.starts_with("prof.fdata.")).unwrap();
        assert_eq!(bolt, [dir.0.join("prof.fdata.7.fdata")]);
        assert!(profiles_in(&dir.0, |name| name.ends_with(".none")).is_err());
    }

    #[test]
    fn a_binary_is_bolted_when_it_names_bolts_section() {
        let dir = TempDir::new("bolted").unwrap();
        let bolted = dir.0.join("bolted");
        std::fs::write(&bolted, b"\x7fELF...\0.note.bolt_info\0.text\0").unwrap();
        let plain = dir.0.join("plain");
        std::fs::write(&plain, b"\x7fELF...\0.note.gnu.build-id\0.text\0").unwrap();
        assert!(is_bolted(&bolted).unwrap());
        assert!(!is_bolted(&plain).unwrap());
        assert!(is_bolted(&dir.0.join("missing")).is_err());
    }
}
