//! `baton-mock`: the fast mock provider as a process, for `cargo xtask bench load`,
//! `cargo xtask soak` and `cargo xtask conformance`.
//!
//! `baton-mock [--delay-ms N] [--chunks N] [--gap-ms N] [--threads N]` binds 127.0.0.1:0 and
//! prints `listening 127.0.0.1:PORT` on stdout (a fixed port would race with other processes),
//! then serves until killed: the fast mock's routes (`baton_testkit::fast::router`) and the mock
//! MCP server at `/mcp`, on `--threads` threads (default 1), each a single-threaded runtime with
//! its own `SO_REUSEPORT` listener on the one port.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use baton_testkit::fast::{self, FastMock, FastMockOptions};
use baton_testkit::mcp;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("baton-mock: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut options = FastMockOptions {
        stream_chunks: 20,
        ..FastMockOptions::default()
    };
    let mut threads = 1;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value: u64 = args
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{flag} needs a whole number"))?;
        match flag.as_str() {
            "--delay-ms" => options.delay = Duration::from_millis(value),
            "--chunks" => options.stream_chunks = usize::try_from(value).unwrap_or(usize::MAX),
            "--gap-ms" => options.chunk_gap = Duration::from_millis(value),
            "--threads" => threads = usize::try_from(value).unwrap_or(1).max(1),
            other => return Err(format!("unknown option {other}")),
        }
    }
    let router = fast::router(options).merge(mcp::router());
    let mock = FastMock::serve_on_threads(router, threads).map_err(|e| e.to_string())?;
    // The port line is this program's interface to the xtask.
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening {}", mock.address()).map_err(|e| e.to_string())?;
    stdout.flush().map_err(|e| e.to_string())?;
    loop {
        std::thread::park();
    }
}
