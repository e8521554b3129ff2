//! The `baton-mock` process as the load benchmark and the soak start it: the port line, a
//! completion, a stream of the shaped route's length, the failing route, the tool host and MCP.
//! (Also what makes `cargo test --workspace` build the binary, which `cargo xtask bench load
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

#[test]
fn serves_completions_and_streams_of_the_shaped_length() {
    let mut child = Killed(
        Command::new(env!("CARGO_BIN_EXE_baton-mock"))
            .args(["--chunks", "3", "--gap-ms", "0"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let address = line.trim().strip_prefix("listening ").unwrap().to_string();

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
