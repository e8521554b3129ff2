//! The `baton-mock` process as the load benchmark and the soak start it: the port line, a
//! completion, a stream of the shaped route's length, the failing route, the tool host and MCP;
//! and the `baton-floor` proxy in front of it.
//! (Also what makes `cargo test --workspace` build the binaries, which `cargo xtask bench load
//! --smoke` and `cargo xtask soak --smoke` then reuse.)

// The whole binary is test code: panicking on a broken expectation is the point.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn post(address: &str, path: &str, body: &str) -> String {
    post_with(address, path, body, "")
}

/// `extra` holds further header lines, each ending in CRLF.
fn post_with(address: &str, path: &str, body: &str, extra: &str) -> String {
    let mut stream = TcpStream::connect(address).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// Starts a testkit program and reads the address from its `listening ADDRESS` line.
fn announced(command: &mut Command) -> (Killed, String) {
    let mut child = Killed(command.stdout(Stdio::piped()).spawn().unwrap());
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let address = line.trim().strip_prefix("listening ").unwrap().to_string();
    (child, address)
}

#[test]
fn serves_completions_and_streams_of_the_shaped_length() {
    let (_mock, address) = announced(
        Command::new(env!("CARGO_BIN_EXE_baton-mock")).args(["--chunks", "3", "--gap-ms", "0"]),
    );

    let completion = post(&address, "/v1/chat/completions", r#"{"model":"m"}"#);
    assert!(completion.starts_with("HTTP/1.1 200"), "{completion}");
    assert!(completion.contains("\"chat.completion\""), "{completion}");

    let stream = r#"{"model":"m","stream":true}"#;
    let default = post(&address, "/v1/chat/completions", stream);
    assert_eq!(default.matches("\"tok \"").count(), 3, "{default}");
    let shaped = post(&address, "/shape/7/1/v1/chat/completions", stream);
    assert!(shaped.contains("text/event-stream"), "{shaped}");
    assert_eq!(shaped.matches("\"tok \"").count(), 7, "{shaped}");
    assert!(shaped.contains("\"completion_tokens\":7"), "{shaped}");
    assert!(shaped.contains("data: [DONE]"), "{shaped}");

    // The soak's routes: failures at the set share (500, then 429), the tool host, MCP.
    let failing: Vec<String> = (0..4)
        .map(|_| post(&address, "/fail/50/v1/chat/completions", r#"{"model":"m"}"#))
        .collect();
    let statuses: Vec<&str> = failing.iter().map(|r| &r[9..12]).collect();
    assert_eq!(statuses, ["200", "500", "200", "429"], "{failing:?}");
    let mut stream = TcpStream::connect(&address).unwrap();
    write!(
        stream,
        "GET /tool/echo?text=hi HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut echo = String::new();
    stream.read_to_string(&mut echo).unwrap();
    assert!(echo.contains(r#"{"echo":"text=hi"}"#), "{echo}");
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let mcp = post_with(
        &address,
        "/mcp",
        initialize,
        "Accept: application/json, text/event-stream\r\n",
    );
    assert!(mcp.starts_with("HTTP/1.1 200"), "{mcp}");
}

#[test]
fn serves_on_as_many_threads_as_asked_each_accepting_on_the_one_port() {
    let (mock, address) = announced(Command::new(env!("CARGO_BIN_EXE_baton-mock")).args([
        "--threads",
        "3",
        "--chunks",
        "2",
    ]));
    // Each serving thread is named `mock-N` (a thread names itself once it runs, so the names
    // are read until all three are there).
    let task_dir = format!("/proc/{}/task", mock.0.id());
    let serving = || -> Vec<String> {
        std::fs::read_dir(&task_dir)
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.unwrap().path().join("comm")).ok())
            .map(|name| name.trim().to_string())
            .filter(|name| name.starts_with("mock-"))
            .collect()
    };
    let mut named = serving();
    for _ in 0..100 {
        if named.len() >= 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        named = serving();
    }
    named.sort();
    assert_eq!(named, ["mock-0", "mock-1", "mock-2"]);
    // Connections spread over the threads' listeners (by the kernel's hash of each
    // connection): every one of them is answered, whichever thread took it.
    for _ in 0..24 {
        let completion = post(&address, "/v1/chat/completions", r#"{"model":"m"}"#);
        assert!(completion.starts_with("HTTP/1.1 200"), "{completion}");
    }
}

#[test]
fn the_floor_proxy_forwards_each_path_to_its_upstream_and_relays_the_answer() {
    let (_mock, mock) = announced(
        Command::new(env!("CARGO_BIN_EXE_baton-mock")).args(["--chunks", "3", "--gap-ms", "0"]),
    );
    let (_floor, floor) = announced(Command::new(env!("CARGO_BIN_EXE_baton-floor")).args([
        "--upstream",
        &format!("http://{mock}"),
        "--threads",
        "2",
    ]));
    assert_ne!(floor, mock);

    let completion = post(&floor, "/v1/chat/completions", r#"{"model":"m"}"#);
    assert!(completion.starts_with("HTTP/1.1 200"), "{completion}");
    assert!(completion.contains("\"chat.completion\""), "{completion}");
    // The shaped route's path goes through as it is: seven chunks, not the default three.
    let shaped = post(
        &floor,
        "/shape/7/1/v1/chat/completions",
        r#"{"model":"m","stream":true}"#,
    );
    assert!(shaped.contains("text/event-stream"), "{shaped}");
    assert_eq!(shaped.matches("\"tok \"").count(), 7, "{shaped}");
    assert!(shaped.contains("data: [DONE]"), "{shaped}");
    // The upstream's own status comes back unchanged.
    let failing: Vec<String> = (0..2)
        .map(|_| post(&floor, "/fail/100/v1/chat/completions", r#"{"model":"m"}"#))
        .collect();
    assert!(
        failing.iter().all(|r| !r.starts_with("HTTP/1.1 200")),
        "{failing:?}"
    );

    // No upstream: 502.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = closed.local_addr().unwrap();
    drop(closed);
    let (_orphan, orphan) = announced(
        Command::new(env!("CARGO_BIN_EXE_baton-floor"))
            .args(["--upstream", &format!("http://{gone}")]),
    );
    let refused = post(&orphan, "/v1/chat/completions", r#"{"model":"m"}"#);
    assert!(refused.starts_with("HTTP/1.1 502"), "{refused}");
}
