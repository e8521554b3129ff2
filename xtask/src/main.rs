//! `cargo xtask <task>`: the project's chores, in Rust instead of shell scripts.

use std::process::{Command, ExitCode};

mod conformance;
mod fuzz;
mod load;
mod pgo;
mod soak;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("openapi") => openapi(args.get(1).map(String::as_str)),
        Some("bench") if args.get(1).map(String::as_str) == Some("load") => load::run(&args[2..]),
        Some("bench") if args.get(1).map(String::as_str) == Some("instructions") => {
            load::instructions::run(&args[2..])
        }
        Some("bench") => bench(&args[1..]),
        Some("conformance") => conformance::run(&args[1..]),
        Some("fuzz") => fuzz::run(&args[1..]),
        Some("soak") => soak::run(&args[1..]),
        Some("pgo") => pgo::run(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask <task>\n\ntasks:\n  openapi [--check]   write docs/openapi.json (or check it is current)\n  bench [ARGS]        run the benchmarks; ARGS go to `cargo bench` (e.g. -- render_10kb)\n  bench load [OPTIONS] load-test Baton (and --peer litellm) against the fast mock;\n                      --smoke for CI, --help for the options (docs/benchmarks.md)\n  bench instructions [--requests N] [--warm-up N] [--gateways sqlite,nolog] [--pgo] [--cache-sim]\n                      instructions (and cache misses) per request under callgrind (needs valgrind)\n  conformance [--max-examples N] [--seed S] [-- SCHEMATHESIS ARGS]\n                      schemathesis against the running service (docs/reliability.md)\n  fuzz [--seconds N] [--dev] [TARGET...]\n                      run the fuzz targets N seconds each (default 60; --dev: unoptimised\n                      build, as CI runs it; docs/reliability.md)\n  soak [--smoke] [--duration S] [--rate R]\n                      soak the real binary with a mixed load; nothing may be lost (docs/reliability.md)\n  pgo [--requests N] [--bolt]\n                      a profile-guided `baton` in target/pgo/baton, trained on the bench's load;\n                      --bolt: its layout optimised by BOLT too (docs/performance.md,\n                      \"Profile-guided build\")"
            );
            return ExitCode::FAILURE;
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// A `cargo` command for a nested build, without the variables `cargo run` set for the xtask
/// itself (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, ...). Build scripts track some of them (ring's
/// tracks `CARGO_MANIFEST_DIR`): inherited, they made every build started from here differ from
/// a plain `cargo test` or `cargo build`, so each switch rebuilt ring and everything above it
/// (~2 minutes of CI twice a run; a fat-LTO `baton` again after `cargo build --release`).
pub(crate) fn cargo_command() -> Command {
    let mut command = Command::new(env!("CARGO"));
    without_run_variables(&mut command);
    pin_toolchain(&mut command);
    command
}

/// Started as `cargo xtask`, rustup's proxy has set `RUSTUP_TOOLCHAIN` and every nested `rustc`
/// runs the workspace's toolchain. Started directly (`target/release/xtask`), each nested
/// `rustc` proxy picks its toolchain from the directory cargo runs it in, and a registry crate
/// with a `rust-toolchain.toml` of its own (atoi 2.0.0 names 1.57.0) asks for one that is not
/// installed; so the workspace's is named here. Without rustup nothing needs pinning.
fn pin_toolchain(command: &mut Command) {
    if let Some(toolchain) = workspace_toolchain() {
        command.env("RUSTUP_TOOLCHAIN", toolchain);
    }
}

/// The toolchain to pin nested builds to, asked of rustup once per run (every nested build
/// would otherwise start `rustup` again); `None` when rustup already pinned it or is absent.
fn workspace_toolchain() -> Option<&'static str> {
    static TOOLCHAIN: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    TOOLCHAIN
        .get_or_init(|| {
            if std::env::var_os("RUSTUP_TOOLCHAIN").is_some() {
                return None;
            }
            let output = Command::new("rustup")
                .args(["show", "active-toolchain"])
                .current_dir(load::workspace_root())
                .output()
                .ok()
                .filter(|output| output.status.success())?;
            // "1.95.0-x86_64-unknown-linux-gnu (overridden by '.../rust-toolchain.toml')"
            String::from_utf8_lossy(&output.stdout)
                .split_whitespace()
                .next()
                .map(str::to_owned)
        })
        .as_deref()
}

/// Removes from `command`'s environment what `cargo run` set for this process.
pub(crate) fn without_run_variables(command: &mut Command) {
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if is_run_variable(name) {
            command.env_remove(name);
        }
    }
}

fn is_run_variable(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_MANIFEST_")
        || matches!(
            name,
            "CARGO_PRIMARY_PACKAGE" | "CARGO_CRATE_NAME" | "CARGO_BIN_NAME" | "OUT_DIR"
        )
}

/// The committed document is regenerated by a test (`openapi_document_is_current`), so this only
/// runs it with the update switch.
fn openapi(flag: Option<&str>) -> anyhow::Result<()> {
    let mut command = cargo_command();
    command.args([
        "test",
        "-p",
        "baton-server",
        "--test",
        "api",
        "openapi_document_is_current",
    ]);
    if flag != Some("--check") {
        command.env("BATON_UPDATE_OPENAPI", "1");
    }
    let status = command.status()?;
    anyhow::ensure!(status.success(), "openapi task failed");
    Ok(())
}

/// Packages with benchmarks. Listed rather than `--workspace`, which would build every crate's
/// test harness in release mode for nothing.
const BENCH_PACKAGES: &[&str] = &[
    "baton-template",
    "baton-providers",
    "baton-ledger",
    "baton-executor",
    "baton-store",
];

/// `cargo bench` over [`BENCH_PACKAGES`]; everything after `bench` is passed through, so
/// `cargo xtask bench -- --sample-size 20` reaches criterion.
fn bench(args: &[String]) -> anyhow::Result<()> {
    let mut command = cargo_command();
    command.arg("bench");
    for package in BENCH_PACKAGES {
        command.args(["-p", package]);
    }
    let status = command.args(args).status()?;
    anyhow::ensure!(status.success(), "bench task failed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_cargo_drops_what_cargo_run_set_and_keeps_the_rest() {
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_PKG_NAME",
            "OUT_DIR",
        ] {
            assert!(is_run_variable(name), "{name}");
        }
        for name in [
            "CARGO_INCREMENTAL",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "PATH",
            "CARGO",
        ] {
            assert!(!is_run_variable(name), "{name}");
        }
    }
}
