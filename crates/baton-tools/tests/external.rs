//! External tool calls against a real HTTP host (`ToolHost`), through the outbound guard.
// Test helpers outside #[test] functions fail loudly too.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use baton_domain::Timestamp;
use baton_domain::origin::CallbackOrigin;
use baton_domain::tool::{EnvironmentOverride, Tool, ToolConfig, ToolParameters, ToolType};
use baton_testkit::tool_host::ToolHost;
use baton_tools::external::{CallContext, ExternalOutcome, OriginSource, call_external};
use baton_tools::{GuardPolicy, GuardedClient, ToolError};
use serde_json::{Map, Value, json};
use url::Url;

const MB: usize = 1024 * 1024;
const TIMEOUT: Duration = Duration::from_secs(5);

fn tool(web_url: &str) -> Tool {
    Tool {
        id: "t1".into(),
        name: "weather".into(),
        description: None,
        tool_type: ToolType::External,
        type_alias: ToolType::External,
        parameters: ToolParameters::default(),
        config: ToolConfig {
            web_url: Some(web_url.into()),
            ..ToolConfig::default()
        },
        created_at: Timestamp::now(),
        updated_at: Timestamp::now(),
    }
}

fn with_headers(mut tool: Tool, headers: &[(&str, &str)]) -> Tool {
    tool.config.headers = headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect::<BTreeMap<_, _>>();
    tool
}

fn arguments(value: Value) -> Map<String, Value> {
    value.as_object().cloned().unwrap()
}

/// A host, a client allowed to reach it, and the host registered as the tenant's callback origin.
struct Setup {
    host: ToolHost,
    client: GuardedClient,
    callback: Url,
    origins: Vec<CallbackOrigin>,
    parameters: HashMap<String, String>,
}

impl Setup {
    async fn new() -> Setup {
        let host = ToolHost::start().await.unwrap();
        let client = GuardedClient::new(
            GuardPolicy::strict().allowing(host.addr()),
            Duration::from_secs(2),
        )
        .unwrap();
        let callback = Url::parse(&format!("{}/caller/path?ignored=1", host.origin())).unwrap();
        let origins = vec![CallbackOrigin::parse(&host.origin(), "o").unwrap()];
        Setup {
            host,
            client,
            callback,
            origins,
            parameters: HashMap::new(),
        }
    }

    /// A caller-hosted context: callback URL and token sent.
    fn caller<'a>(&'a self, token: Option<&'a str>) -> CallContext<'a> {
        CallContext {
            environment: None,
            parameters: &self.parameters,
            callback_url: Some(&self.callback),
            callback_token: token,
            callback_origins: &self.origins,
        }
    }

    /// No callback URL; a token is sent anyway (it must not reach a stored host).
    fn stored(&self) -> CallContext<'_> {
        CallContext {
            environment: None,
            parameters: &self.parameters,
            callback_url: None,
            callback_token: Some("secret-token"),
            callback_origins: &self.origins,
        }
    }

    async fn call(&self, tool: &Tool, ctx: &CallContext<'_>, args: Value) -> ExternalOutcome {
        call_external(&self.client, tool, ctx, &arguments(args), TIMEOUT, MB).await
    }
}

#[tokio::test]
async fn arguments_arrive_as_query_parameters_with_lists_repeated() {
    let setup = Setup::new().await;
    let tool = tool(&format!("{}/echo?fixed=1", setup.host.origin()));
    let outcome = setup
        .call(
            &tool,
            &setup.stored(),
            json!({"city": "São Paulo & co", "days": 3, "tags": ["a", "b"], "metric": false}),
        )
        .await;
    let body = outcome.result.unwrap();
    assert_eq!(outcome.origin_source, OriginSource::Tool);
    let seen = setup.host.requests();
    assert_eq!(seen.len(), 1);
    let request = &seen[0];
    assert_eq!(request.path, "/echo");
    assert_eq!(request.query_values("fixed"), ["1"]);
    assert_eq!(request.query_values("city"), ["São Paulo & co"]);
    assert_eq!(request.query_values("days"), ["3"]);
    assert_eq!(request.query_values("tags"), ["a", "b"]);
    assert_eq!(request.query_values("metric"), ["false"]);
    // The echo body is what the model receives.
    let echoed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echoed["path"], "/echo");
}

#[tokio::test]
async fn target_url_has_no_query_string() {
    let setup = Setup::new().await;
    let tool = tool(&format!("{}/echo?key=stored-secret", setup.host.origin()));
    let outcome = setup
        .call(&tool, &setup.stored(), json!({"city": "Paris"}))
        .await;
    assert!(outcome.result.is_ok());
    assert_eq!(
        outcome.target_url,
        Some(format!("{}/echo", setup.host.origin()))
    );
}

#[tokio::test]
async fn stored_headers_arrive_and_no_token_goes_to_a_stored_host() {
    let setup = Setup::new().await;
    let tool = with_headers(
        tool(&format!("{}/echo", setup.host.origin())),
        &[("X-Api-Key", "k1"), ("Authorization", "Bearer stored")],
    );
    let outcome = setup.call(&tool, &setup.stored(), json!({})).await;
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    let request = &setup.host.requests()[0];
    assert_eq!(request.header("x-api-key"), Some("k1"));
    assert_eq!(request.header("authorization"), Some("Bearer stored"));
    assert_eq!(request.header("x-tool-token"), None);
    assert!(
        request.headers.iter().all(|(_, v)| v != "secret-token"),
        "{:?}",
        request.headers
    );
}

#[tokio::test]
async fn an_environment_pinned_host_gets_no_token_even_with_a_callback_url() {
    let mut setup = Setup::new().await;
    let mut pinned = tool("/weather");
    pinned.config.environment_overrides = BTreeMap::from([(
        "prod".into(),
        EnvironmentOverride {
            web_url: format!("{}/pinned", setup.host.origin()),
        },
    )]);
    setup.parameters.clear();
    let ctx = CallContext {
        environment: Some("prod"),
        ..setup.caller(Some("secret-token"))
    };
    let outcome = setup.call(&pinned, &ctx, json!({})).await;
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(outcome.origin_source, OriginSource::Environment);
    let request = &setup.host.requests()[0];
    assert_eq!(request.path, "/pinned");
    assert_eq!(request.header("x-tool-token"), None);
}

#[tokio::test]
async fn the_token_arrives_under_x_tool_token_on_caller_hosted_calls() {
    let setup = Setup::new().await;
    let tool = with_headers(tool("/tools/weather?unit=c"), &[("X-Api-Key", "k1")]);
    let outcome = setup
        .call(
            &tool,
            &setup.caller(Some("secret-token")),
            json!({"city": "Oslo"}),
        )
        .await;
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(outcome.origin_source, OriginSource::Callback);
    assert_eq!(
        outcome.target_url,
        Some(format!("{}/tools/weather", setup.host.origin()))
    );
    let request = &setup.host.requests()[0];
    // The callback URL's own path and query are ignored.
    assert_eq!(request.path, "/tools/weather");
    assert_eq!(request.query_values("ignored"), Vec::<&str>::new());
    assert_eq!(request.query_values("unit"), ["c"]);
    assert_eq!(request.query_values("city"), ["Oslo"]);
    assert_eq!(request.header("x-tool-token"), Some("secret-token"));
    assert_eq!(request.header("x-api-key"), Some("k1"));
}

#[tokio::test]
async fn the_token_uses_a_custom_header_and_wins_over_a_stored_one() {
    let setup = Setup::new().await;
    let mut custom = with_headers(
        tool("/echo"),
        // Stored under a different case: header names are case-insensitive.
        &[("x-caller-secret", "stored-value"), ("X-Other", "o")],
    );
    custom.config.callback_token_header = Some("X-Caller-Secret".into());
    let outcome = setup
        .call(&custom, &setup.caller(Some("secret-token")), json!({}))
        .await;
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    let request = &setup.host.requests()[0];
    let values: Vec<&str> = request
        .headers
        .iter()
        .filter(|(n, _)| n == "x-caller-secret")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(values, ["secret-token"]);
    assert_eq!(request.header("x-tool-token"), None);
    assert_eq!(request.header("x-other"), Some("o"));

    // The default header name replaces a stored X-Tool-Token the same way.
    let default = with_headers(tool("/echo"), &[("X-TOOL-TOKEN", "stored-value")]);
    setup
        .call(&default, &setup.caller(Some("secret-token")), json!({}))
        .await
        .result
        .unwrap();
    let request = &setup.host.requests()[1];
    assert_eq!(request.header("x-tool-token"), Some("secret-token"));
    assert!(request.headers.iter().all(|(_, v)| v != "stored-value"));
}

#[tokio::test]
async fn the_legacy_callback_redirect_sends_the_token_but_not_the_stored_headers() {
    let setup = Setup::new().await;
    // The stored host is never contacted: the callback origin replaces it. The headers stored
    // for api.example.com (its credentials) are not the caller's to collect.
    let stored = with_headers(
        tool("https://api.example.com/v1/weather?unit=c"),
        &[("Authorization", "Bearer vendor-secret")],
    );
    let outcome = setup
        .call(&stored, &setup.caller(Some("secret-token")), json!({}))
        .await;
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(outcome.origin_source, OriginSource::Callback);
    let request = &setup.host.requests()[0];
    assert_eq!(request.path, "/v1/weather");
    assert_eq!(request.header("x-tool-token"), Some("secret-token"));
    assert_eq!(request.header("authorization"), None);
    // A caller-hosted (relative) tool's headers are meant for the caller's hosts.
    let relative = with_headers(
        tool("/v1/weather"),
        &[("Authorization", "Bearer for-callers")],
    );
    let outcome = setup
        .call(&relative, &setup.caller(Some("secret-token")), json!({}))
        .await;
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    let request = &setup.host.requests()[1];
    assert_eq!(request.header("authorization"), Some("Bearer for-callers"));
}

#[tokio::test]
async fn a_caller_hosted_tool_without_a_callback_url_fails_without_a_request() {
    let setup = Setup::new().await;
    let outcome = setup.call(&tool("/echo"), &setup.stored(), json!({})).await;
    assert_eq!(outcome.origin_source, OriginSource::Callback);
    assert_eq!(outcome.target_url, None);
    let err = outcome.result.unwrap_err();
    assert!(
        err.to_string().contains("no X-Baton-Callback-Url header"),
        "{err}"
    );
    assert!(setup.host.requests().is_empty());
}

#[tokio::test]
async fn bodies_are_capped_with_and_without_content_length() {
    let setup = Setup::new().await;
    for path in ["big", "big-chunked"] {
        let big = tool(&format!("{}/{path}", setup.host.origin()));
        let outcome = setup
            .call(&big, &setup.stored(), json!({"bytes": 2 * MB}))
            .await;
        assert_eq!(
            outcome.result,
            Err(ToolError::TooLarge { limit: MB }),
            "{path}"
        );
        let outcome = setup
            .call(&big, &setup.stored(), json!({"bytes": 500 * 1024}))
            .await;
        assert_eq!(outcome.result.unwrap().len(), 500 * 1024, "{path}");
    }
}

#[tokio::test]
async fn a_slow_tool_times_out() {
    let setup = Setup::new().await;
    let slow = tool(&format!("{}/sleep", setup.host.origin()));
    let started = std::time::Instant::now();
    let outcome = call_external(
        &setup.client,
        &slow,
        &setup.stored(),
        &arguments(json!({"ms": 3000})),
        Duration::from_millis(200),
        MB,
    )
    .await;
    assert_eq!(outcome.result, Err(ToolError::Timeout));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(outcome.target_url.is_some());
}

#[tokio::test]
async fn a_non_2xx_status_is_an_error_naming_it() {
    let setup = Setup::new().await;
    let failing = tool(&format!("{}/status/503", setup.host.origin()));
    let outcome = setup
        .call(&failing, &setup.stored(), json!({"bytes": 5000}))
        .await;
    let Err(ToolError::Status { status, body }) = outcome.result else {
        panic!("expected a status error: {:?}", outcome.result);
    };
    assert_eq!(status, 503);
    assert!(body.starts_with("status 503 from the tool host"), "{body}");
    // At most ~200 characters of the body are quoted.
    assert!(body.chars().count() <= 203, "{}", body.len());
    let message = ToolError::Status { status, body }.to_string();
    assert!(message.contains("503"), "{message}");
}

#[tokio::test]
async fn the_strict_guard_refuses_the_loopback_host_whatever_the_allowlist_says() {
    let setup = Setup::new().await;
    let strict = GuardedClient::new(GuardPolicy::strict(), Duration::from_secs(2)).unwrap();
    // Stored host.
    let stored = tool(&format!("{}/echo", setup.host.origin()));
    let outcome = call_external(&strict, &stored, &setup.stored(), &Map::new(), TIMEOUT, MB).await;
    assert!(
        matches!(outcome.result, Err(ToolError::Forbidden { .. })),
        "{:?}",
        outcome.result
    );
    // Caller-hosted, with the origin registered: the guard still refuses a loopback address.
    let caller = tool("/echo");
    let outcome = call_external(
        &strict,
        &caller,
        &setup.caller(Some("secret-token")),
        &Map::new(),
        TIMEOUT,
        MB,
    )
    .await;
    assert_eq!(outcome.origin_source, OriginSource::Callback);
    assert!(
        matches!(outcome.result, Err(ToolError::Forbidden { .. })),
        "{:?}",
        outcome.result
    );
    assert!(setup.host.requests().is_empty());
}

#[tokio::test]
async fn a_placeholder_may_stand_for_the_port() {
    let mut setup = Setup::new().await;
    let port = setup.host.addr().port().to_string();
    setup.parameters.insert("port".into(), port);
    let stored = tool("http://127.0.0.1:[[port]]/echo");
    let outcome = setup.call(&stored, &setup.stored(), json!({})).await;
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(setup.host.requests()[0].path, "/echo");
}
