//! The MCP client against the testkit's mock MCP server (Streamable HTTP on a loopback port,
//! let through the guard as an exact exception).

#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use baton_testkit::MockMcpServer;
use baton_tools::mcp::{self, McpEndpoint};
use baton_tools::{GuardPolicy, GuardedClient, ToolError};
use serde_json::{Map, Value, json};
use url::Url;

const TIMEOUT: Duration = Duration::from_secs(10);
const MAX_BYTES: usize = 64 * 1024;

fn client_for(address: SocketAddr) -> GuardedClient {
    GuardedClient::new(
        GuardPolicy::strict().allowing(address),
        Duration::from_secs(2),
    )
    .unwrap()
}

fn args(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

async fn call(
    server: &MockMcpServer,
    name: &str,
    arguments: Value,
    timeout: Duration,
    max_bytes: usize,
) -> Result<String, ToolError> {
    let url = Url::parse(&server.url()).unwrap();
    let headers = BTreeMap::new();
    let endpoint = McpEndpoint {
        url: &url,
        headers: &headers,
    };
    mcp::call_tool(
        &client_for(server.address()),
        endpoint,
        name,
        args(arguments),
        timeout,
        max_bytes,
    )
    .await
}

#[tokio::test]
async fn discover_lists_every_tool_with_its_schema() {
    let server = MockMcpServer::start().await;
    let url = Url::parse(&server.url()).unwrap();
    let headers = BTreeMap::new();
    let endpoint = McpEndpoint {
        url: &url,
        headers: &headers,
    };
    // The mock answers two tools a page: six tools means the cursors were followed.
    let tools = mcp::discover(&client_for(server.address()), endpoint, TIMEOUT)
        .await
        .unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["add", "big", "echo", "fail", "files.read", "slow"]);

    let add = tools.iter().find(|t| t.name == "add").unwrap();
    assert_eq!(add.description.as_deref(), Some("Adds two numbers"));
    assert_eq!(add.input_schema["type"], "object");
    assert_eq!(add.input_schema["properties"]["a"]["type"], "number");
    assert_eq!(add.input_schema["properties"]["b"]["type"], "number");
    let echo = tools.iter().find(|t| t.name == "echo").unwrap();
    assert_eq!(echo.input_schema["properties"]["text"]["type"], "string");
    assert_eq!(echo.input_schema["required"], json!(["text"]));
    assert!(server.calls().is_empty());
}

#[tokio::test]
async fn call_tool_returns_the_text_and_the_server_got_the_arguments() {
    let server = MockMcpServer::start().await;
    let text = call(&server, "add", json!({"a": 2, "b": 3}), TIMEOUT, MAX_BYTES)
        .await
        .unwrap();
    assert_eq!(text, "5");
    let echoed = call(
        &server,
        "echo",
        json!({"text": "ab", "times": 3}),
        TIMEOUT,
        MAX_BYTES,
    )
    .await
    .unwrap();
    assert_eq!(echoed, "ababab");
    assert_eq!(
        server.calls(),
        [
            ("add".to_string(), json!({"a": 2, "b": 3})),
            ("echo".to_string(), json!({"text": "ab", "times": 3})),
        ]
    );
}

#[tokio::test]
async fn configured_headers_are_sent_on_every_request() {
    let server = MockMcpServer::start_with_required_header("authorization", "Bearer s3cret").await;
    let url = Url::parse(&server.url()).unwrap();
    let client = client_for(server.address());

    let without = BTreeMap::new();
    let endpoint = McpEndpoint {
        url: &url,
        headers: &without,
    };
    let err = mcp::discover(&client, endpoint, TIMEOUT).await.unwrap_err();
    assert!(matches!(err, ToolError::Request(_)), "{err:?}");
    assert!(err.to_string().contains("401"), "{err}");

    let with = BTreeMap::from([
        ("Authorization".to_string(), "Bearer s3cret".to_string()),
        ("X-Tenant".to_string(), "t-1".to_string()),
    ]);
    let endpoint = McpEndpoint {
        url: &url,
        headers: &with,
    };
    let tools = mcp::discover(&client, endpoint, TIMEOUT).await.unwrap();
    assert_eq!(tools.len(), 6);
    // Initialize, initialized, three pages and the session's streams: all carried the header.
    let tenant = server.seen_header("x-tenant");
    assert!(tenant.len() >= 5, "{tenant:?}");
    assert!(tenant.iter().all(|v| v == "t-1"));
    assert_eq!(
        server.seen_header("authorization").len(),
        tenant.len(),
        "every request with the tenant header also carried the token"
    );
}

#[tokio::test]
async fn invalid_headers_are_refused_without_showing_their_value() {
    let server = MockMcpServer::start().await;
    let url = Url::parse(&server.url()).unwrap();
    let client = client_for(server.address());
    for (name, value) in [
        ("Bad Name", "v"),
        ("Authorization", "Bearer line\nbreak-s3cret"),
        ("Accept", "text/plain"),
    ] {
        let headers = BTreeMap::from([(name.to_string(), value.to_string())]);
        let endpoint = McpEndpoint {
            url: &url,
            headers: &headers,
        };
        let err = mcp::discover(&client, endpoint, TIMEOUT).await.unwrap_err();
        assert!(matches!(err, ToolError::InvalidHeader { .. }), "{err:?}");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }
    assert_eq!(server.requests(), 0);
}

#[tokio::test]
async fn a_reported_failure_is_tool_reported() {
    let server = MockMcpServer::start().await;
    let err = call(&server, "fail", json!({}), TIMEOUT, MAX_BYTES)
        .await
        .unwrap_err();
    assert_eq!(err, ToolError::ToolReported("boom".into()));
}

#[tokio::test]
async fn an_unknown_tool_is_a_protocol_error() {
    let server = MockMcpServer::start().await;
    let err = call(&server, "nope", json!({}), TIMEOUT, MAX_BYTES)
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::Mcp(_)), "{err:?}");
}

#[tokio::test]
async fn output_over_the_limit_is_too_large() {
    let server = MockMcpServer::start().await;
    let err = call(&server, "big", json!({"bytes": 2000}), TIMEOUT, 1000)
        .await
        .unwrap_err();
    assert_eq!(err, ToolError::TooLarge { limit: 1000 });
    let fits = call(&server, "big", json!({"bytes": 1000}), TIMEOUT, 1000)
        .await
        .unwrap();
    assert_eq!(fits.len(), 1000);
}

#[tokio::test]
async fn an_answer_past_what_the_transport_reads_is_too_large_not_a_closed_transport() {
    // Far past the SSE event bound (twice the limit plus 64 KiB): rmcp stops reading and ends
    // the session; the call must still say why.
    let server = MockMcpServer::start().await;
    let err = call(&server, "big", json!({"bytes": 1_000_000}), TIMEOUT, 1000)
        .await
        .unwrap_err();
    assert_eq!(err, ToolError::TooLarge { limit: 1000 });
    // A plain JSON answer (read whole by rmcp, up to its own bound) is refused too.
    let plain = MockMcpServer::start_json().await;
    let err = call(&plain, "big", json!({"bytes": 1_000_000}), TIMEOUT, 1000)
        .await
        .unwrap_err();
    assert_eq!(err, ToolError::TooLarge { limit: 1000 });
    let fits = call(&plain, "big", json!({"bytes": 1000}), TIMEOUT, 1000)
        .await
        .unwrap();
    assert_eq!(fits.len(), 1000);
}

#[tokio::test]
async fn a_slow_tool_times_out() {
    let server = MockMcpServer::start().await;
    let started = std::time::Instant::now();
    let err = call(
        &server,
        "slow",
        json!({"ms": 5000}),
        Duration::from_millis(500),
        MAX_BYTES,
    )
    .await
    .unwrap_err();
    assert_eq!(err, ToolError::Timeout);
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn an_unreachable_server_is_a_request_error() {
    // A port that was just free: nothing listens there.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let url = Url::parse(&format!("http://{address}/mcp?token=s3cret")).unwrap();
    let headers = BTreeMap::new();
    let endpoint = McpEndpoint {
        url: &url,
        headers: &headers,
    };
    let err = mcp::discover(&client_for(address), endpoint, TIMEOUT)
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::Request(_)), "{err:?}");
    let message = err.to_string();
    assert!(!message.contains("s3cret"), "{message}");
    assert!(message.to_lowercase().contains("connect"), "{message}");
}

#[tokio::test]
async fn the_guard_refuses_the_loopback_mock_without_an_allowance() {
    let server = MockMcpServer::start().await;
    let strict = GuardedClient::new(GuardPolicy::strict(), Duration::from_secs(2)).unwrap();
    let headers = BTreeMap::new();
    let port = server.address().port();
    for url in [
        server.url(),
        // A name is refused when it resolves, inside the transport.
        format!("http://localhost:{port}/mcp"),
    ] {
        let url = Url::parse(&url).unwrap();
        let endpoint = McpEndpoint {
            url: &url,
            headers: &headers,
        };
        let err = mcp::discover(&strict, endpoint, TIMEOUT).await.unwrap_err();
        assert!(matches!(err, ToolError::Forbidden { .. }), "{url}: {err:?}");
        let err = mcp::call_tool(
            &strict,
            endpoint,
            "add",
            args(json!({"a": 1, "b": 1})),
            TIMEOUT,
            MAX_BYTES,
        )
        .await
        .unwrap_err();
        assert!(matches!(err, ToolError::Forbidden { .. }), "{url}: {err:?}");
    }
    assert_eq!(server.requests(), 0);
    assert!(server.calls().is_empty());
}
