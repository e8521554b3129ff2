//! MCP tools: a client for tenant-registered MCP servers over Streamable HTTP (rmcp).
//!
//! Every session goes through the outbound guard: the URL is checked before connecting and the
//! transport uses the guarded `reqwest::Client` (its resolver and redirect policy refuse private
//! destinations). A session lives for one operation: connect, list or call, disconnect.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::error::Error as StdError;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ClientJsonRpcMessage,
    ContentBlock, Implementation, PaginatedRequestParams,
};
use rmcp::service::{ClientInitializeError, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse,
};
use rmcp::{ServiceError, ServiceExt};
use serde_json::{Map, Value};
use sse_stream::Sse;
use tokio::time::Instant;
use url::Url;

use crate::error::ToolError;
use crate::guard::{GuardedClient, redact};

/// Pages of `tools/list` followed at most: a server repeating a cursor must not loop until the
/// deadline while the list grows.
const MAX_TOOL_PAGES: usize = 100;

/// Characters of a failure message kept (it may quote the server's answer).
const MAX_MESSAGE_CHARS: usize = 300;

// Headers the transport sets itself; a tenant's value would clash with them.
use baton_domain::tool::MCP_TRANSPORT_HEADERS as TRANSPORT_HEADERS;

/// A tool as the server describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoveredTool {
    pub name: String,
    pub description: Option<String>,
    /// The tool's JSON Schema for its arguments (an object).
    pub input_schema: Value,
}

/// Where an MCP server is, and the headers (often secrets) sent on every request to it.
#[derive(Debug, Clone, Copy)]
pub struct McpEndpoint<'a> {
    pub url: &'a Url,
    pub headers: &'a BTreeMap<String, String>,
}

type Session = RunningService<RoleClient, ClientConfig>;
type HttpError = StreamableHttpError<reqwest::Error>;

/// Connects (initialize handshake), lists all tools (following pagination cursors), disconnects.
pub async fn discover(
    client: &GuardedClient,
    endpoint: McpEndpoint<'_>,
    timeout: Duration,
) -> Result<Vec<DiscoveredTool>, ToolError> {
    let deadline = Instant::now() + timeout;
    let http = BoundedHttp::new(client);
    let session = within(deadline, connect(client, http, endpoint, None)).await?;
    let tools = within(deadline, list_tools(&session, endpoint.url)).await;
    disconnect(session, deadline).await;
    tools
}

/// Connects, calls one tool with `arguments`, disconnects. The result is text for the model:
/// text parts as they are, other parts as compact JSON, joined with "\n"; without any text part,
/// `structuredContent` is added as JSON. A result flagged `isError` is
/// [`ToolError::ToolReported`]; text over `max_bytes` is [`ToolError::TooLarge`].
pub async fn call_tool(
    client: &GuardedClient,
    endpoint: McpEndpoint<'_>,
    name: &str,
    arguments: Map<String, Value>,
    timeout: Duration,
    max_bytes: usize,
) -> Result<String, ToolError> {
    let deadline = Instant::now() + timeout;
    let http = BoundedHttp::new(client);
    let refused = http.too_large.clone();
    let session = within(deadline, connect(client, http, endpoint, Some(max_bytes))).await?;
    let params = CallToolRequestParams::new(name.to_string()).with_arguments(arguments);
    let result = within(deadline, async {
        session.call_tool(params).await.map_err(|err| {
            // rmcp ends the session over an answer past its bound, and the call sees only
            // "Transport closed": say why.
            if refused.load(Ordering::SeqCst) {
                ToolError::TooLarge { limit: max_bytes }
            } else {
                service_error(err, endpoint.url)
            }
        })
    })
    .await;
    disconnect(session, deadline).await;
    let result = result?;
    let text = render(&result, max_bytes)?;
    if result.is_error == Some(true) {
        Err(ToolError::ToolReported(text))
    } else {
        Ok(text)
    }
}

/// Runs `work` until `deadline`; past it, the work is dropped (closing its session).
async fn within<T>(
    deadline: Instant,
    work: impl Future<Output = Result<T, ToolError>>,
) -> Result<T, ToolError> {
    tokio::time::timeout_at(deadline, work)
        .await
        .unwrap_or(Err(ToolError::Timeout))
}

/// `max_result_bytes` bounds what the transport reads of one server event while reading (the
/// JSON-RPC envelope around a result: escaping can double the text, hence the margin); the
/// result's text is checked exactly afterwards. JSON (non-SSE) answers are bounded by rmcp itself
/// (16 MiB) while reading: rmcp's client reads them whole, and replacing its POST handling to
/// stop at our bound is more than this wrapper does (`docs/reliability.md`).
async fn connect(
    client: &GuardedClient,
    http: BoundedHttp,
    endpoint: McpEndpoint<'_>,
    max_result_bytes: Option<usize>,
) -> Result<Session, ToolError> {
    // IP literals are checked here; names are checked by the guarded resolver on each request.
    client.policy().check_url(endpoint.url)?;
    let mut config = StreamableHttpClientTransportConfig::with_uri(endpoint.url.as_str());
    config.custom_headers = header_map(endpoint.headers)?;
    if let Some(max) = max_result_bytes {
        config.max_sse_event_size = max
            .saturating_mul(2)
            .saturating_add(64 * 1024)
            .min(config.max_sse_event_size);
    }
    let transport = StreamableHttpClientTransport::with_client(http, config);
    let identity = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("baton", env!("CARGO_PKG_VERSION")),
    );
    identity
        .serve(transport)
        .await
        .map_err(|err| init_error(err, endpoint.url))
}

/// rmcp's reqwest client (over the guarded client) that notes when an answer was refused for
/// its size: an SSE event past `max_sse_event_size`, or a JSON body past rmcp's own 16 MiB.
#[derive(Clone)]
struct BoundedHttp {
    inner: reqwest::Client,
    too_large: Arc<AtomicBool>,
}

impl BoundedHttp {
    fn new(client: &GuardedClient) -> BoundedHttp {
        BoundedHttp {
            inner: client.inner().clone(),
            too_large: Arc::new(AtomicBool::new(false)),
        }
    }

    fn note_post(
        &self,
        response: Result<StreamableHttpPostResponse, HttpError>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        match response {
            Ok(StreamableHttpPostResponse::Sse(stream, session)) => Ok(
                StreamableHttpPostResponse::Sse(self.note_stream(stream), session),
            ),
            Err(error @ StreamableHttpError::ResponseBodyTooLarge { .. }) => {
                self.too_large.store(true, Ordering::SeqCst);
                Err(error)
            }
            other => other,
        }
    }

    fn note_stream(
        &self,
        stream: BoxStream<'static, Result<Sse, SseError>>,
    ) -> BoxStream<'static, Result<Sse, SseError>> {
        let flag = self.too_large.clone();
        stream
            .inspect(move |item| {
                // rmcp's size error is private to it; its message is what identifies it.
                if let Err(error) = item
                    && error.to_string().contains("exceeded the maximum size")
                {
                    flag.store(true, Ordering::SeqCst);
                }
            })
            .boxed()
    }
}

impl StreamableHttpClient for BoundedHttp {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let response = self
            .inner
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await;
        self.note_post(response)
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let response = self
            .inner
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        self.note_post(response)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), HttpError> {
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        let stream = self
            .inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await?;
        Ok(self.note_stream(stream))
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        let stream = self
            .inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await?;
        Ok(self.note_stream(stream))
    }
}

/// Closes the session (a DELETE in stateful mode) if time is left; dropping it cancels anyway.
async fn disconnect(session: Session, deadline: Instant) {
    let _ = tokio::time::timeout_at(deadline, session.cancel()).await;
}

async fn list_tools(session: &Session, url: &Url) -> Result<Vec<DiscoveredTool>, ToolError> {
    let mut tools = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_TOOL_PAGES {
        let page = session
            .list_tools(Some(PaginatedRequestParams::default().with_cursor(cursor)))
            .await
            .map_err(|err| service_error(err, url))?;
        tools.extend(page.tools.into_iter().map(|tool| DiscoveredTool {
            name: tool.name.into_owned(),
            description: tool.description.map(|d| d.into_owned()),
            input_schema: Value::Object(tool.input_schema.as_ref().clone()),
        }));
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(tools);
        }
    }
    Err(ToolError::Mcp(format!(
        "the tool list has more than {MAX_TOOL_PAGES} pages"
    )))
}

/// The configured headers as the transport wants them. Messages name the header, never its value.
fn header_map(
    headers: &BTreeMap<String, String>,
) -> Result<HashMap<HeaderName, HeaderValue>, ToolError> {
    let invalid = |name: &str, reason: &str| ToolError::InvalidHeader {
        name: name.to_string(),
        reason: reason.to_string(),
    };
    headers
        .iter()
        .map(|(name, value)| {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| invalid(name, "not a valid header name"))?;
            if TRANSPORT_HEADERS.contains(&header.as_str()) {
                return Err(invalid(name, "set by the MCP transport itself"));
            }
            let mut value = HeaderValue::from_str(value)
                .map_err(|_| invalid(name, "the value is not a valid header value"))?;
            // Kept out of debug output (they are usually credentials).
            value.set_sensitive(true);
            Ok((header, value))
        })
        .collect()
}

/// The tool's answer as text, refused once it passes `max_bytes`.
fn render(result: &CallToolResult, max_bytes: usize) -> Result<String, ToolError> {
    let mut parts = Vec::with_capacity(result.content.len() + 1);
    let mut size = 0usize;
    for block in &result.content {
        let part = match block {
            ContentBlock::Text(text) => Cow::Borrowed(text.text.as_str()),
            other => Cow::Owned(compact_json(other)?),
        };
        // Refused as soon as the parts alone pass the bound, before anything is copied.
        size = size.saturating_add(part.len());
        if size > max_bytes {
            return Err(ToolError::TooLarge { limit: max_bytes });
        }
        parts.push(part);
    }
    let has_text = result
        .content
        .iter()
        .any(|block| matches!(block, ContentBlock::Text(_)));
    if !has_text && let Some(structured) = &result.structured_content {
        parts.push(Cow::Owned(compact_json(structured)?));
    }
    let text = parts.join("\n");
    if text.len() > max_bytes {
        return Err(ToolError::TooLarge { limit: max_bytes });
    }
    Ok(text)
}

fn compact_json(value: &impl serde::Serialize) -> Result<String, ToolError> {
    serde_json::to_string(value)
        .map_err(|err| ToolError::Mcp(format!("unreadable tool result: {err}")))
}

fn init_error(err: ClientInitializeError, url: &Url) -> ToolError {
    match err {
        ClientInitializeError::JsonRpcError(data) => {
            ToolError::Mcp(format!("initialization refused: {}", data.message))
        }
        ClientInitializeError::TransportError { error, .. } => transport_error(&*error.error, url),
        other => transport_error(&other, url),
    }
}

fn service_error(err: ServiceError, url: &Url) -> ToolError {
    match err {
        ServiceError::McpError(data) => ToolError::Mcp(data.message.into_owned()),
        ServiceError::Timeout { .. } => ToolError::Timeout,
        ServiceError::TransportSend(error) => transport_error(&*error.error, url),
        other => transport_error(&other, url),
    }
}

/// A transport failure: a guard refusal anywhere in the chain stays a refusal; otherwise the
/// cause, without the URL's query (it may hold a token).
fn transport_error(err: &(dyn StdError + 'static), url: &Url) -> ToolError {
    let mut current = Some(err);
    while let Some(error) = current {
        if let Some(refused) = error.downcast_ref::<ToolError>() {
            return refused.clone();
        }
        if let Some(http) = error.downcast_ref::<reqwest::Error>() {
            return reqwest_error(http);
        }
        current = next_cause(error);
    }
    // Other failures (e.g. "HTTP 401 Unauthorized: <body>") quote the server, so keep it short.
    let message = err.to_string().replace(url.as_str(), &redact(url));
    ToolError::Request(match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((end, _)) => format!("{}...", &message[..end]),
        None => message,
    })
}

/// The next error in the chain, looking inside rmcp wrappers that do not expose their cause
/// through `source()`.
fn next_cause<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a (dyn StdError + 'static)> {
    if let Some(HttpError::Client(inner)) = error.downcast_ref::<HttpError>() {
        return Some(inner);
    }
    error.source()
}

/// A reqwest failure named by its causes (connection refused, TLS, ...) but not its URL.
fn reqwest_error(err: &reqwest::Error) -> ToolError {
    let mut source = err.source();
    while let Some(cause) = source {
        if let Some(refused) = cause.downcast_ref::<ToolError>() {
            return refused.clone();
        }
        source = cause.source();
    }
    if err.is_timeout() {
        return ToolError::Timeout;
    }
    let mut message = err.to_string();
    if let Some(url) = err.url() {
        message = message.replace(&format!(" for url ({url})"), "");
    }
    let mut source = err.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    ToolError::Request(message)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Handlers and spawned tasks await these: their futures must be `Send`.
    #[allow(dead_code)]
    fn futures_are_send(client: &GuardedClient, endpoint: McpEndpoint<'_>) {
        fn send<T: Send>(_: T) {}
        send(discover(client, endpoint, Duration::ZERO));
        send(call_tool(
            client,
            endpoint,
            "t",
            Map::new(),
            Duration::ZERO,
            1,
        ));
    }

    #[test]
    fn text_parts_are_joined_and_other_parts_are_json() {
        let result = CallToolResult::success(vec![
            ContentBlock::text("one"),
            ContentBlock::image("AAAA", "image/png"),
            ContentBlock::text("two"),
        ]);
        assert_eq!(
            render(&result, 1000).unwrap(),
            "one\n{\"type\":\"image\",\"data\":\"AAAA\",\"mimeType\":\"image/png\"}\ntwo"
        );
    }

    #[test]
    fn structured_content_is_used_only_without_text() {
        let mut result = CallToolResult::success(Vec::new());
        result.structured_content = Some(json!({"temperature": 21}));
        assert_eq!(render(&result, 1000).unwrap(), r#"{"temperature":21}"#);

        let mut with_text = CallToolResult::success(vec![ContentBlock::text("21 degrees")]);
        with_text.structured_content = Some(json!({"temperature": 21}));
        assert_eq!(render(&with_text, 1000).unwrap(), "21 degrees");
    }

    #[test]
    fn the_size_limit_counts_bytes() {
        let result = CallToolResult::success(vec![ContentBlock::text("é".repeat(3))]);
        assert_eq!(render(&result, 6).unwrap(), "ééé");
        assert_eq!(render(&result, 5), Err(ToolError::TooLarge { limit: 5 }));
    }

    #[test]
    fn header_errors_name_the_header_but_not_the_value() {
        let headers = BTreeMap::from([("X-Key".to_string(), "s3cret\r\n".to_string())]);
        let err = header_map(&headers).unwrap_err();
        assert!(err.to_string().contains("X-Key"), "{err}");
        assert!(!err.to_string().contains("s3cret"), "{err}");

        let headers = BTreeMap::from([("Mcp-Session-Id".to_string(), "x".to_string())]);
        assert!(matches!(
            header_map(&headers),
            Err(ToolError::InvalidHeader { .. })
        ));
        let headers = BTreeMap::from([("Authorization".to_string(), "Bearer t".to_string())]);
        let map = header_map(&headers).unwrap();
        assert!(map[&HeaderName::from_static("authorization")].is_sensitive());
    }
}
