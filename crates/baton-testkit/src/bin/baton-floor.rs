//! `baton-floor`: the floor proxy (`baton_testkit::floor`) as a process, for
//! `cargo xtask bench load --gateways ...,floor`.
//!
//! `baton-floor --upstream http://HOST:PORT [--threads N]` binds 127.0.0.1:0, prints
//! `listening 127.0.0.1:PORT` on stdout and forwards every request's path to the upstream
//! until killed.

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("baton-floor: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut upstream = None;
    let mut threads = std::thread::available_parallelism().map_or(1, usize::from);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--upstream" => upstream = Some(value),
            "--threads" => {
                threads = value
                    .parse()
                    .map_err(|_| format!("--threads needs a whole number, not {value}"))?;
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    let upstream = upstream.ok_or("--upstream http://HOST:PORT is required")?;
    let address = baton_testkit::floor::spawn(upstream, threads).map_err(|e| e.to_string())?;
    // The port line is this program's interface to the xtask.
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening {address}").map_err(|e| e.to_string())?;
    stdout.flush().map_err(|e| e.to_string())?;
    loop {
        std::thread::park();
    }
}
