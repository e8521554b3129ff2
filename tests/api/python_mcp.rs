//! A real MCP server no one here wrote: a FastMCP server from the official `mcp` Python SDK,
//! registered, discovered, imported, assigned to a template and called by a flow run.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use baton_testkit::{Reply, ToolCallReply};
use reqwest::Method;
use serde_json::{Value, json};

use crate::chat::app_with_mock_and;
use crate::python_sdk::python_with;

/// The last 1.x release: the SDK's 2.x renamed FastMCP.
pub(crate) const MCP_SDK: &str = "mcp==1.30.0";

/// Kills the server when the test ends, passed or not.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_fastmcp_server_is_discovered_imported_and_called_by_a_flow() {
    let python = tokio::task::spawn_blocking(|| python_with(MCP_SDK, "py-mcp-sdk"))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("calls.jsonl");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/fastmcp_server.py");
    let mut child = Command::new(python)
        .arg(script)
        .arg(&record)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _server = Server(child);
    // The script prints its port once it listens.
    let port: u16 = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
        line.trim()
            .parse()
            .unwrap_or_else(|_| panic!("no port from the server: {line:?}"))
    })
    .await
    .unwrap();
    let address: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    let (app, mock) = app_with_mock_and(move |config| config.outbound_allowed.push(address)).await;
    let key = app.default_tenant.api_key.clone();
    let ok = |method: Method, path: String, body: Option<Value>| {
        let (app, key) = (&app, key.clone());
        async move {
            let response = app.request(method.clone(), &path, Some(&key), body).await;
            assert!(
                response.status.is_success(),
                "{method} {path}: {} {}",
                response.status,
                response.text
            );
            response.json()
        }
    };
    let server = ok(
        Method::POST,
        "/api/v1/mcp-servers".into(),
        Some(json!({"name": "orders", "url": format!("http://127.0.0.1:{port}/mcp")})),
    )
    .await;
    let id = server["id"].as_str().unwrap().to_string();
    let found = ok(
        Method::POST,
        format!("/api/v1/mcp-servers/{id}/discover"),
        None,
    )
    .await;
    let lookup = found
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "lookup_order")
        .unwrap_or_else(|| panic!("no lookup_order in {found}"));
    assert_eq!(lookup["alreadyImported"], false);
    assert_eq!(
        lookup["inputSchema"]["properties"]["quantity"]["type"],
        "integer"
    );
    let imported = ok(
        Method::POST,
        format!("/api/v1/mcp-servers/{id}/import"),
        Some(json!({"toolNames": ["lookup_order"]})),
    )
    .await;
    let tool = &imported[0];
    assert_eq!(tool["type"], "Mcp");
    let quantity = tool["parameters"]["properties"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "quantity")
        .unwrap();
    assert_eq!(quantity["type"], "Integer");
    assert_eq!(quantity["required"], true);

    let flow = ok(
        Method::POST,
        "/api/v1/flows".into(),
        Some(json!({"title": "Order desk"})),
    )
    .await;
    let slug = flow["name"].as_str().unwrap().to_string();
    let versions = ok(Method::GET, format!("/api/v1/flows/{slug}/versions"), None).await;
    let v1 = versions[0]["id"].as_str().unwrap().to_string();
    ok(
        Method::PUT,
        format!("/api/v1/flows/{slug}/versions/{v1}/templates/main"),
        Some(
            json!({"template": "Answer about orders.", "toolIds": [tool["id"]],
                    "llm": "openai/gpt-4o-mini"}),
        ),
    )
    .await;
    ok(
        Method::POST,
        "/api/v1/environments".into(),
        Some(json!({"name": "production"})),
    )
    .await;
    ok(
        Method::POST,
        format!("/api/v1/flows/{slug}/versions/{v1}/environments"),
        Some(json!({"environment": "production"})),
    )
    .await;

    mock.push(Reply::Answer {
        text: String::new(),
        tool_calls: vec![ToolCallReply {
            id: "call_1".into(),
            name: "lookup_order".into(),
            arguments: json!({"order_id": "A-17", "quantity": 3}),
        }],
        tokens_in: 10,
        tokens_out: 5,
        model: None,
        web_searches: 0,
        citations: Vec::new(),
    });
    mock.push(Reply::text("Order A-17 has shipped."));
    let run = ok(
        Method::POST,
        format!("/api/v1/flows/{slug}/runs"),
        Some(json!({})),
    )
    .await;
    assert_eq!(run["output"]["text"], "Order A-17 has shipped.");
    assert_eq!(run["toolCalls"][0]["status"], "succeeded", "{run}");

    // The server got the model's arguments, and its answer went back to the model.
    let calls = std::fs::read_to_string(&record).unwrap();
    let first: Value = serde_json::from_str(calls.lines().next().unwrap()).unwrap();
    assert_eq!(
        first,
        json!({"tool": "lookup_order", "arguments": {"order_id": "A-17", "quantity": 3}})
    );
    let second_call = &mock.received()[1].body;
    let tool_result = second_call["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap();
    assert!(
        tool_result["content"]
            .to_string()
            .contains("order A-17 x3: shipped"),
        "{tool_result}"
    );
}
