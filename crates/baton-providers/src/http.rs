//! What every adapter does over HTTP: one tuned client per provider, sending, and turning
//! failures into [`ProviderError`]s that keep the provider's message and no credential.
//!
//! Requests are built with reqwest's builder and sent straight through hyper-util's pooled
//! client over reqwest's own TLS stack (hyper-rustls, the platform's verifier). reqwest's
//! client wraps every call in its redirect layer, even with redirects off, and that layer
//! and the response parse the URL twice a call (~16,000 instructions, a twelfth of a
//! request's path through Baton: docs/performance.md, "Provider calls past reqwest's
//! layers"). reqwest still sends where its own handling is needed: a proxy named by the
//! environment, or a client the caller gave.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http_body_util::BodyExt as _;
use hyper_util::client::legacy::connect::HttpConnector;
use reqwest::header::HeaderMap;
use reqwest::{RequestBuilder, StatusCode};
use rustls::pki_types::CertificateDer;
use serde_json::Value;

use crate::error::{ProviderError, ProviderResult};
use crate::provider::{DeltaStream, require_finish};

const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Error bodies beyond this are cut: they are read only for their message.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Idle keep-alive connections kept per provider host. At least the concurrency a gateway is
/// driven at (the load benchmark opens 1,000 streams at once): with fewer, every connection
/// past the bound was closed after its call and the next call reconnected, which a profile at
/// 1,000 RPS showed at ~13% of CPU once the machine was saturated. An idle connection costs a
/// socket and a few KB; the pool's idle timeout closes those a burst left behind.
const POOL_MAX_IDLE_PER_HOST: usize = 1024;

/// Environment variables reqwest reads a proxy from; with one set, calls go through reqwest.
const PROXY_VARIABLES: &[&str] = &[
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
];

/// Whether the environment names a proxy (reqwest honours it; the direct pools would not).
fn proxy_in_environment() -> bool {
    PROXY_VARIABLES
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()))
}

/// hyper-util's pooled client over HTTP or TLS (HTTP/1.1, or HTTP/2 where the server offers
/// it), sending reqwest's request bodies.
type DirectClient =
    hyper_util::client::legacy::Client<hyper_rustls::HttpsConnector<HttpConnector>, reqwest::Body>;

/// The HTTP client a provider owns: pooled keep-alive connections, no Nagle delay, no total
/// timeout (streams may run long; non-streaming calls set one per request).
///
/// One pool per serving thread ([`use_client_slot`]): a pooled connection's socket is read and
/// written by the runtime that opened it, so a request served on another thread's runtime
/// would cross threads twice per call (and once per streamed chunk). A thread's pool is built
/// on its first call, so threads that never call a provider cost nothing.
#[derive(Clone)]
pub struct ProviderClient {
    slots: Arc<ClientSlots>,
}

struct ClientSlots {
    /// Builds every request; sends them where the pools are reqwest's.
    builder: reqwest::Client,
    /// Slot 0's pool: the thread that did not pick a slot (tests, admin commands, the main
    /// runtime), and the fallback when another slot's pool cannot be built.
    first: Pool,
    others: Box<[OnceLock<Pool>]>,
    connect_timeout: Duration,
    /// The TLS settings of direct pools (their certificate store is loaded once); `None`:
    /// reqwest sends.
    tls: Option<rustls::ClientConfig>,
}

/// Where one thread's calls are sent.
#[derive(Clone)]
#[expect(
    clippy::large_enum_variant,
    reason = "one per serving thread, built once and read in place"
)]
enum Pool {
    Direct(DirectClient),
    Reqwest(reqwest::Client),
}

thread_local! {
    static CLIENT_SLOT: Cell<usize> = const { Cell::new(0) };
}

/// Pools a [`ProviderClient`] can hold; serving threads past it share (their calls still
/// work, crossing threads).
const POOL_SLOTS: usize = 64;

/// Makes the calling thread use the `slot`th pool of every [`ProviderClient`]. A
/// thread-per-core server calls it once on each serving thread, numbering them from 1 (0 is
/// every other thread's).
pub fn use_client_slot(slot: usize) {
    CLIENT_SLOT.with(|current| current.set(slot));
}

impl ProviderClient {
    /// A pool per serving thread, each built on its first use; reqwest's pools when the
    /// environment names a proxy.
    pub fn new(connect_timeout: Option<Duration>) -> ProviderResult<ProviderClient> {
        Self::build(connect_timeout, (!proxy_in_environment()).then(Vec::new))
    }

    /// [`Self::new`] with reqwest sending whatever the environment says (tests of that path).
    #[cfg(test)]
    fn via_reqwest(connect_timeout: Option<Duration>) -> ProviderResult<ProviderClient> {
        Self::build(connect_timeout, None)
    }

    /// Direct pools when `extra_roots` is given, their TLS trusting those roots besides the
    /// platform's.
    fn build(
        connect_timeout: Option<Duration>,
        extra_roots: Option<Vec<CertificateDer<'static>>>,
    ) -> ProviderResult<ProviderClient> {
        let connect_timeout = connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        let builder = build_client(connect_timeout)?;
        let tls = extra_roots.map(tls_config).transpose()?;
        let first = match &tls {
            Some(tls) => Pool::Direct(direct_client(tls.clone(), connect_timeout)),
            None => Pool::Reqwest(builder.clone()),
        };
        Ok(ProviderClient {
            slots: Arc::new(ClientSlots {
                builder,
                first,
                others: (1..POOL_SLOTS).map(|_| OnceLock::new()).collect(),
                connect_timeout,
                tls,
            }),
        })
    }

    /// What requests are built with.
    pub fn get(&self) -> &reqwest::Client {
        &self.slots.builder
    }

    /// The calling thread's pool.
    fn pool(&self) -> &Pool {
        let slots = &*self.slots;
        let slot = CLIENT_SLOT.with(Cell::get);
        if slot == 0 || slots.others.is_empty() {
            return &slots.first;
        }
        slots.others[(slot - 1) % slots.others.len()].get_or_init(|| match &slots.tls {
            Some(tls) => Pool::Direct(direct_client(tls.clone(), slots.connect_timeout)),
            // Building failed where the first pool's build succeeded: share that pool.
            None => build_client(slots.connect_timeout)
                .map_or_else(|_| slots.first.clone(), Pool::Reqwest),
        })
    }

    /// Whether calls skip reqwest's client.
    #[cfg(test)]
    fn is_direct(&self) -> bool {
        matches!(self.pool(), Pool::Direct(_))
    }
}

/// A client given by the caller (tests, benchmarks): every thread shares its pool.
impl From<reqwest::Client> for ProviderClient {
    fn from(client: reqwest::Client) -> Self {
        ProviderClient {
            slots: Arc::new(ClientSlots {
                builder: client.clone(),
                first: Pool::Reqwest(client),
                others: Box::new([]),
                connect_timeout: DEFAULT_CONNECT_TIMEOUT,
                tls: None,
            }),
        }
    }
}

impl std::fmt::Debug for ProviderClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderClient")
            .field("pools", &(1 + self.slots.others.len()))
            .field("direct", &self.slots.tls.is_some())
            .finish_non_exhaustive()
    }
}

fn build_client(connect_timeout: Duration) -> ProviderResult<reqwest::Client> {
    reqwest::Client::builder()
        // A model API never answers a call with a redirect; following one would send the
        // request's key (`x-api-key`, `api-key`: reqwest strips only `Authorization` across
        // hosts) and the prompt wherever it points. A redirect is an error naming the target.
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
        .build()
        .map_err(|e| ProviderError::Connection {
            provider: "http client".into(),
            message: e.to_string(),
        })
}

/// reqwest's TLS settings: aws-lc-rs (or the process's default provider), TLS 1.2 and 1.3,
/// the platform's certificate verifier.
fn tls_config(extra_roots: Vec<CertificateDer<'static>>) -> ProviderResult<rustls::ClientConfig> {
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
    let failed = |e: rustls::Error| ProviderError::Connection {
        provider: "http client".into(),
        message: format!("TLS settings: {e}"),
    };
    let verifier = if extra_roots.is_empty() {
        rustls_platform_verifier::Verifier::new(provider.clone())
    } else {
        rustls_platform_verifier::Verifier::new_with_extra_roots(extra_roots, provider.clone())
    }
    .map_err(failed)?;
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(failed)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth())
}

fn direct_client(tls: rustls::ClientConfig, connect_timeout: Duration) -> DirectClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(http);
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .build(connector)
}

/// An endpoint whose URL does not change between requests, parsed once: reqwest parses a URL
/// given as text on every request (about 20,000 instructions with the host's IDNA check, a
/// tenth of a request's path through Baton).
#[derive(Debug, Clone)]
pub(crate) struct FixedUrl {
    text: String,
    parsed: Option<reqwest::Url>,
}

impl FixedUrl {
    pub(crate) fn new(text: String) -> Self {
        let parsed = reqwest::Url::parse(&text).ok();
        FixedUrl { text, parsed }
    }

    pub(crate) fn post(&self, client: &reqwest::Client) -> reqwest::RequestBuilder {
        match &self.parsed {
            Some(url) => client.post(url.clone()),
            // Not a URL: reqwest reports it when the request is sent, as it always did.
            None => client.post(self.text.as_str()),
        }
    }
}

/// A provider's answer: its status, headers and a body read as it arrives.
pub enum ProviderResponse {
    Direct(http::Response<hyper::body::Incoming>),
    Reqwest(reqwest::Response),
}

/// Why a response body could not be read to its end.
#[derive(Debug)]
pub struct BodyError(String);

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BodyError {}

impl BodyError {
    fn of(error: &(dyn std::error::Error + 'static)) -> Self {
        BodyError(error_chain(error))
    }
}

impl ProviderResponse {
    pub fn status(&self) -> StatusCode {
        match self {
            ProviderResponse::Direct(response) => response.status(),
            ProviderResponse::Reqwest(response) => response.status(),
        }
    }

    pub fn headers(&self) -> &HeaderMap {
        match self {
            ProviderResponse::Direct(response) => response.headers(),
            ProviderResponse::Reqwest(response) => response.headers(),
        }
    }

    /// The whole body.
    pub async fn bytes(self) -> Result<Bytes, BodyError> {
        match self {
            ProviderResponse::Direct(response) => response
                .into_body()
                .collect()
                .await
                .map(|body| body.to_bytes())
                .map_err(|e| BodyError::of(&e)),
            ProviderResponse::Reqwest(response) => {
                response.bytes().await.map_err(|e| BodyError::of(&e))
            }
        }
    }

    /// The body's next piece, `None` at its end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, BodyError> {
        match self {
            ProviderResponse::Direct(response) => {
                std::future::poll_fn(|cx| poll_data(response.body_mut(), cx))
                    .await
                    .transpose()
            }
            ProviderResponse::Reqwest(response) => {
                response.chunk().await.map_err(|e| BodyError::of(&e))
            }
        }
    }

    /// The body as its pieces arrive.
    pub fn bytes_stream(self) -> BodyStream {
        match self {
            ProviderResponse::Direct(response) => BodyStream::Direct(response.into_body()),
            ProviderResponse::Reqwest(response) => {
                BodyStream::Reqwest(Box::pin(response.bytes_stream()))
            }
        }
    }
}

/// A response body's pieces ([`ProviderResponse::bytes_stream`]).
pub enum BodyStream {
    Direct(hyper::body::Incoming),
    Reqwest(Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>),
}

impl Stream for BodyStream {
    type Item = Result<Bytes, BodyError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.get_mut() {
            BodyStream::Direct(body) => poll_data(body, cx),
            BodyStream::Reqwest(stream) => stream
                .poll_next_unpin(cx)
                .map(|item| item.map(|piece| piece.map_err(|e| BodyError::of(&e)))),
        }
    }
}

/// The next data frame of a hyper body, `None` at its end; trailers carry no body bytes.
fn poll_data(
    body: &mut hyper::body::Incoming,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Bytes, BodyError>>> {
    loop {
        match std::task::ready!(hyper::body::Body::poll_frame(Pin::new(&mut *body), cx)) {
            None => return Poll::Ready(None),
            Some(Err(e)) => return Poll::Ready(Some(Err(BodyError::of(&e)))),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    return Poll::Ready(Some(Ok(data)));
                }
            }
        }
    }
}

/// Sends a request and returns the response if its status is a success.
pub async fn send(
    client: &ProviderClient,
    provider: &str,
    model: &str,
    request: RequestBuilder,
) -> ProviderResult<ProviderResponse> {
    execute(client, provider, model, request)
        .await
        .map(|(response, _)| response)
}

/// Sends a streaming call and turns its body into deltas with `parse`. The stream must reach
/// its finish event ([`require_finish`]), and errors inside it are scrubbed of the request's
/// credentials like a refused call's (a provider's in-stream error event can echo the key too).
///
/// `timeout` is the provider's whole-call timeout of synchronous calls. A stream may run
/// longer than any such bound, so it bounds the wait for the response headers and for the
/// first delta, from the call's start: a provider that hangs before answering fails with a
/// retryable timeout (the chain moves on) instead of holding the request until its deadline.
pub async fn stream(
    client: &ProviderClient,
    provider: &str,
    model: &str,
    request: RequestBuilder,
    timeout: Option<Duration>,
    parse: impl FnOnce(ProviderResponse) -> DeltaStream,
) -> ProviderResult<DeltaStream> {
    let by = timeout.map(|limit| tokio::time::Instant::now() + limit);
    let (response, secrets) = match by {
        Some(by) => tokio::time::timeout_at(by, execute(client, provider, model, request))
            .await
            .map_err(|_| ProviderError::Timeout {
                provider: provider.to_string(),
                stage: "headers, provider timeout",
            })??,
        None => execute(client, provider, model, request).await?,
    };
    let mut deltas = require_finish(provider, parse(response));
    if let Some(by) = by {
        deltas = first_by(deltas, by, provider);
    }
    if secrets.is_empty() {
        return Ok(deltas);
    }
    Ok(Box::pin(deltas.map(move |item| {
        item.map_err(|err| scrubbed(err, &secrets))
    })))
}

/// Fails `deltas` with a timeout when its first item has not come by `by`; later items are
/// not timed.
fn first_by(deltas: DeltaStream, by: tokio::time::Instant, provider: &str) -> DeltaStream {
    let provider = provider.to_string();
    // The inner stream is dropped with the timeout, which closes the connection.
    let mut inner = Some(deltas);
    let mut timer = Some(Box::pin(tokio::time::sleep_until(by)));
    Box::pin(futures::stream::poll_fn(move |cx| {
        let Some(stream) = inner.as_mut() else {
            return Poll::Ready(None);
        };
        if let Poll::Ready(item) = stream.poll_next_unpin(cx) {
            timer = None;
            if item.is_none() {
                inner = None;
            }
            return Poll::Ready(item);
        }
        if let Some(sleep) = timer.as_mut()
            && sleep.as_mut().poll(cx).is_ready()
        {
            inner = None;
            return Poll::Ready(Some(Err(ProviderError::Timeout {
                provider: provider.clone(),
                stage: "first token, provider timeout",
            })));
        }
        Poll::Pending
    }))
}

/// Sends a request; a success comes back with the credentials it carried (to scrub from what
/// the stream says later), a failure as the provider's error, already scrubbed.
async fn execute(
    client: &ProviderClient,
    provider: &str,
    model: &str,
    request: RequestBuilder,
) -> ProviderResult<(ProviderResponse, Vec<String>)> {
    let request = request.build().map_err(|e| transport_error(provider, e))?;
    let secrets = credentials(&request);
    let response = match client.pool() {
        Pool::Direct(direct) => send_direct(direct, provider, request).await?,
        Pool::Reqwest(reqwest) => ProviderResponse::Reqwest(
            reqwest
                .execute(request)
                .await
                .map_err(|e| transport_error(provider, e))?,
        ),
    };
    if response.status().is_success() {
        Ok((response, secrets))
    } else {
        Err(scrubbed(
            status_error(provider, model, response).await,
            &secrets,
        ))
    }
}

async fn send_direct(
    client: &DirectClient,
    provider: &str,
    request: reqwest::Request,
) -> ProviderResult<ProviderResponse> {
    let mut request = http::Request::<reqwest::Body>::try_from(request)
        .map_err(|e| transport_error(provider, e))?;
    // What reqwest's client adds to every request.
    request
        .headers_mut()
        .entry(reqwest::header::ACCEPT)
        .or_insert(reqwest::header::HeaderValue::from_static("*/*"));
    client
        .request(request)
        .await
        .map(ProviderResponse::Direct)
        .map_err(|e| direct_error(provider, &e))
}

/// Classifies a failure of a direct call (it names no URL).
fn direct_error(provider: &str, err: &hyper_util::client::legacy::Error) -> ProviderError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            return ProviderError::Timeout {
                provider: provider.to_string(),
                stage: "connect",
            };
        }
        source = error.source();
    }
    ProviderError::Connection {
        provider: provider.to_string(),
        message: error_chain(err),
    }
}

/// An error and its causes, `outer: inner: innermost` (hyper's outer messages alone, such as
/// "client error (Connect)", do not say what failed).
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

/// Headers and query parameters that carry a provider credential.
const CREDENTIAL_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "api-key",
    "x-api-key",
    "x-goog-api-key",
];
const CREDENTIAL_QUERY: &[&str] = &["key", "api-key", "api_key"];
/// Shorter values are not scrubbed: they would cut ordinary words out of messages.
const MIN_SECRET_LEN: usize = 8;

/// The credentials a request carries (header values, the token of `Bearer <token>`, key query
/// parameters), to scrub from what the provider answers: some servers echo the key they refused.
fn credentials(request: &reqwest::Request) -> Vec<String> {
    let mut secrets = Vec::new();
    for name in CREDENTIAL_HEADERS {
        for value in request.headers().get_all(*name) {
            if let Ok(value) = value.to_str() {
                secrets.push(value.trim().to_string());
                if let Some((_, token)) = value.trim().split_once(' ') {
                    secrets.push(token.trim().to_string());
                }
            }
        }
    }
    for (name, value) in request.url().query_pairs() {
        if CREDENTIAL_QUERY.contains(&name.as_ref()) {
            secrets.push(value.into_owned());
        }
    }
    secrets.retain(|s| s.len() >= MIN_SECRET_LEN);
    // Longest first, so a whole header value goes before the token inside it.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets
}

/// `err` with every credential in its provider message replaced by `[redacted]`.
fn scrubbed(err: ProviderError, secrets: &[String]) -> ProviderError {
    let scrub = |mut message: String| {
        for secret in secrets {
            if message.contains(secret.as_str()) {
                message = message.replace(secret.as_str(), "[redacted]");
            }
        }
        message
    };
    match err {
        ProviderError::Status {
            provider,
            status,
            message,
            retry_after,
        } => ProviderError::Status {
            provider,
            status,
            message: scrub(message),
            retry_after,
        },
        ProviderError::ModelNotFound {
            provider,
            model,
            message,
        } => ProviderError::ModelNotFound {
            provider,
            model,
            message: scrub(message),
        },
        ProviderError::InvalidResponse { provider, message } => ProviderError::InvalidResponse {
            provider,
            message: scrub(message),
        },
        // A body broken before the first delta reports the transport's words as a connection
        // error, where they were an invalid response's.
        ProviderError::Connection { provider, message } => ProviderError::Connection {
            provider,
            message: scrub(message),
        },
        other => other,
    }
}

/// Sends a non-streaming call (with its whole-call timeout, if any) and decodes the JSON answer.
pub async fn send_json<T: serde::de::DeserializeOwned>(
    client: &ProviderClient,
    provider: &str,
    model: &str,
    request: RequestBuilder,
    timeout: Option<Duration>,
) -> ProviderResult<T> {
    let call = async {
        let response = send(client, provider, model, request).await?;
        response.bytes().await.map_err(|e| body_error(provider, &e))
    };
    // The bound covers the whole call, the body's read included.
    let bytes =
        match timeout {
            Some(timeout) => tokio::time::timeout(timeout, call).await.map_err(|_| {
                ProviderError::Timeout {
                    provider: provider.to_string(),
                    stage: "response",
                }
            })??,
            None => call.await?,
        };
    decode(provider, &bytes)
}

/// A response body that broke off before its end.
pub fn body_error(provider: &str, err: &BodyError) -> ProviderError {
    ProviderError::Connection {
        provider: provider.to_string(),
        message: format!("the response broke off: {err}"),
    }
}

/// Decodes a provider's JSON answer.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    provider: &str,
    bytes: &[u8],
) -> ProviderResult<T> {
    serde_json::from_slice(bytes).map_err(|e| ProviderError::InvalidResponse {
        provider: provider.to_string(),
        message: e.to_string(),
    })
}

/// Classifies a transport failure. The URL is dropped from the message: some providers carry
/// deployment names or keys in it.
pub fn transport_error(provider: &str, err: reqwest::Error) -> ProviderError {
    let err = err.without_url();
    if err.is_timeout() {
        ProviderError::Timeout {
            provider: provider.to_string(),
            stage: "response",
        }
    } else if err.is_decode() || err.is_body() && !err.is_connect() {
        ProviderError::Connection {
            provider: provider.to_string(),
            message: format!("the response broke off: {err}"),
        }
    } else {
        ProviderError::Connection {
            provider: provider.to_string(),
            message: err.to_string(),
        }
    }
}

async fn status_error(provider: &str, model: &str, response: ProviderResponse) -> ProviderError {
    let status = response.status();
    if status.is_redirection() {
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map_or_else(|| "nowhere".to_string(), |v| v.chars().take(200).collect());
        return ProviderError::Status {
            provider: provider.to_string(),
            status: status.as_u16(),
            message: format!(
                "redirected to {location}; provider calls do not follow redirects \
                 (set the provider's base URL to the address it redirects to)"
            ),
            retry_after: None,
        };
    }
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64);
    let body = read_capped(response, MAX_ERROR_BODY).await;
    let message = error_message(&body).unwrap_or_else(|| {
        let text = String::from_utf8_lossy(&body).trim().to_string();
        if text.is_empty() {
            status.canonical_reason().unwrap_or("error").to_string()
        } else {
            text
        }
    });
    if status == StatusCode::NOT_FOUND || names_unknown_model(status, &body) {
        return ProviderError::ModelNotFound {
            provider: provider.to_string(),
            model: model.to_string(),
            message,
        };
    }
    ProviderError::Status {
        provider: provider.to_string(),
        // Gemini refuses a bad key with 400 (`API_KEY_INVALID`): the operator's key, not the
        // client's request, is at fault, as with another provider's 401.
        status: if names_bad_key(status, &body) {
            StatusCode::UNAUTHORIZED.as_u16()
        } else {
            status.as_u16()
        },
        message,
        retry_after,
    }
}

async fn read_capped(mut response: ProviderResponse, cap: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = cap.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= cap {
            break;
        }
    }
    body
}

/// Whether a refusal that is not a 404 says the model is unknown, as some providers answer an
/// unknown model with 400 (DESIGN.md "Providers": passed on as 404 `MODEL_NOT_FOUND`):
/// Bedrock `ValidationException` "The provided model identifier is invalid.", DeepSeek
/// `{"error": {"message": "Model Not Exist"}}`, Mistral `{"type": "invalid_model"}`, and
/// OpenAI's `model_not_found` code wherever a compatible server sends it.
fn names_unknown_model(status: StatusCode, body: &[u8]) -> bool {
    if !status.is_client_error() {
        return false;
    }
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    let text = |pointer: &str| value.pointer(pointer).and_then(Value::as_str);
    text("/error/code") == Some("model_not_found")
        || text("/code") == Some("model_not_found")
        || status == StatusCode::BAD_REQUEST
            && (text("/type") == Some("invalid_model")
                || text("/error/message") == Some("Model Not Exist")
                || [text("/message"), text("/Message")]
                    .into_iter()
                    .flatten()
                    .any(|m| m.starts_with("The provided model identifier is invalid")))
}

/// A 400 that says the provider key is invalid (Gemini: `reason: API_KEY_INVALID`).
fn names_bad_key(status: StatusCode, body: &[u8]) -> bool {
    status == StatusCode::BAD_REQUEST
        && std::str::from_utf8(body).is_ok_and(|text| {
            text.contains("API_KEY_INVALID") || text.contains("API key not valid")
        })
}

/// Finds the human message in the error bodies of the four wire formats.
fn error_message(body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let value = match &value {
        Value::Array(items) => items.first()?.clone(), // Gemini streams wrap errors in arrays
        _ => value,
    };
    let candidates = [
        value.pointer("/error/message"),
        value.pointer("/message"),
        value.pointer("/Message"),
        value.pointer("/error"),
        value.pointer("/detail"),
    ];
    candidates
        .into_iter()
        .flatten()
        .find_map(|v| v.as_str().map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the calling thread's pool of `client` lives, as a number to compare.
    fn pool_on_slot(client: &ProviderClient, slot: usize) -> usize {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    use_client_slot(slot);
                    let first = std::ptr::from_ref(client.pool()) as usize;
                    assert_eq!(std::ptr::from_ref(client.pool()) as usize, first);
                    first
                })
                .join()
                .unwrap()
        })
    }

    #[test]
    fn each_serving_thread_calls_through_its_own_pool() {
        let client = ProviderClient::new(None).unwrap();
        let unset = std::ptr::from_ref(client.pool()) as usize;
        assert_eq!(pool_on_slot(&client, 0), unset);
        let first_own = pool_on_slot(&client, 1);
        assert_ne!(first_own, unset);
        assert_ne!(pool_on_slot(&client, 2), first_own);
        // Slots past the pools there are wrap around.
        assert_eq!(pool_on_slot(&client, POOL_SLOTS), first_own);
        // A client given by the caller is the one pool of every thread.
        let given = ProviderClient::from(reqwest::Client::new());
        assert_eq!(
            pool_on_slot(&given, 1),
            std::ptr::from_ref(given.pool()) as usize
        );
    }

    #[test]
    fn finds_messages_of_every_format() {
        for body in [
            r#"{"error": {"message": "m", "type": "invalid_request_error"}}"#,
            r#"{"type": "error", "error": {"type": "overloaded_error", "message": "m"}}"#,
            r#"[{"error": {"code": 429, "message": "m", "status": "RESOURCE_EXHAUSTED"}}]"#,
            r#"{"message": "m"}"#,
            r#"{"Message": "m"}"#,
            r#"{"error": "m"}"#,
        ] {
            assert_eq!(
                error_message(body.as_bytes()).as_deref(),
                Some("m"),
                "{body}"
            );
        }
        assert_eq!(error_message(b"<html>"), None);
    }

    /// Unknown-model answers as the providers send them (Bedrock's Converse error body is
    /// `{"message": ...}` with the type in a header).
    #[test]
    fn unknown_model_refusals_are_recognised() {
        let bad = StatusCode::BAD_REQUEST;
        for body in [
            r#"{"message":"The provided model identifier is invalid."}"#,
            r#"{"error":{"message":"Model Not Exist","type":"invalid_request_error","param":null,"code":"invalid_request_error"}}"#,
            r#"{"object":"error","message":"Invalid model: mistral-nope","type":"invalid_model","param":null,"code":"1500"}"#,
            r#"{"error":{"message":"The model `x` does not exist","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#,
        ] {
            assert!(names_unknown_model(bad, body.as_bytes()), "{body}");
        }
        for (status, body) in [
            (
                bad,
                r#"{"message":"Malformed input request: extraneous key [top_n]"}"#,
            ),
            (
                bad,
                r#"{"error":{"message":"Invalid max_tokens","type":"invalid_request_error"}}"#,
            ),
            (
                bad,
                r#"{"object":"error","message":"bad","type":"invalid_request_error"}"#,
            ),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                r#"{"type":"invalid_model"}"#,
            ),
            (bad, "<html>"),
        ] {
            assert!(!names_unknown_model(status, body.as_bytes()), "{body}");
        }
    }

    /// Gemini's refusal of a bad key (a 400) is the operator's fault, as a 401 is.
    #[test]
    fn a_bad_key_refused_with_400_is_told_apart() {
        let gemini = r#"{"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.",
            "status": "INVALID_ARGUMENT", "details": [{"reason": "API_KEY_INVALID"}]}}"#;
        assert!(names_bad_key(StatusCode::BAD_REQUEST, gemini.as_bytes()));
        assert!(!names_bad_key(
            StatusCode::BAD_REQUEST,
            br#"{"error": {"message": "contents is not specified"}}"#
        ));
        assert!(!names_bad_key(
            StatusCode::INTERNAL_SERVER_ERROR,
            gemini.as_bytes()
        ));
    }

    #[tokio::test]
    async fn a_400_for_an_unknown_model_is_model_not_found() {
        use crate::openai::{Flavor, OpenAiProvider};
        use crate::provider::Provider;
        use baton_testkit::{MockProvider, Reply};
        let mock = MockProvider::start().await.unwrap();
        // The mock sends `{"error": {"message": ...}}`, DeepSeek's shape.
        mock.push(Reply::Status {
            status: 400,
            message: "Model Not Exist".into(),
            retry_after: None,
        });
        let deepseek = OpenAiProvider::new(
            "deepseek",
            Flavor::DeepSeek,
            mock.openai_base(),
            Some("sk-test-key-123".to_string().into()),
            ProviderClient::new(None).unwrap(),
            None,
        );
        let request = baton_domain::chat::InferenceRequest {
            model: "deepseek-nope".into(),
            messages: vec![baton_domain::chat::Message::text(
                baton_domain::chat::Role::User,
                "hi",
            )],
            ..Default::default()
        };
        let err = deepseek.infer(&request).await.unwrap_err();
        assert_eq!(
            err,
            ProviderError::ModelNotFound {
                provider: "deepseek".into(),
                model: "deepseek-nope".into(),
                message: "Model Not Exist".into(),
            }
        );
    }

    fn mock_openai(
        mock: &baton_testkit::MockProvider,
        client: &ProviderClient,
        timeout: Option<Duration>,
    ) -> crate::openai::OpenAiProvider {
        crate::openai::OpenAiProvider::new(
            "openai",
            crate::openai::Flavor::OpenAi,
            mock.openai_base(),
            Some("sk-test-key-123".to_string().into()),
            client.clone(),
            timeout,
        )
    }

    /// Both ways a call is sent: straight through hyper-util, and through reqwest's client.
    fn transports() -> [(&'static str, ProviderClient); 2] {
        [
            ("direct", ProviderClient::new(None).unwrap()),
            ("reqwest", ProviderClient::via_reqwest(None).unwrap()),
        ]
    }

    /// A TLS server under a private CA, answering every request with an OpenAI chat
    /// completion; it offers `alpn` and reports the HTTP version of each request it served.
    async fn tls_provider(
        alpn: Vec<Vec<u8>>,
    ) -> (
        std::net::SocketAddr,
        CertificateDer<'static>,
        tokio::sync::mpsc::UnboundedReceiver<http::Version>,
    ) {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .signed_by(&leaf_key, &ca)
            .unwrap();
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap(),
        )
        .unwrap();
        config.alpn_protocols = alpn;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (versions, seen) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let versions = versions.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(socket).await else {
                        return;
                    };
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                    let service = hyper::service::service_fn(
                        move |request: http::Request<hyper::body::Incoming>| {
                            let _ = versions.send(request.version());
                            async move {
                                let body = r#"{"id":"c1","object":"chat.completion","model":"gpt-4o-mini",
                                "choices":[{"index":0,"message":{"role":"assistant","content":"over tls"},
                                "finish_reason":"stop"}],
                                "usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#;
                                Ok::<_, std::convert::Infallible>(
                                    http::Response::builder()
                                        .header("content-type", "application/json")
                                        .body(http_body_util::Full::new(Bytes::from_static(
                                            body.as_bytes(),
                                        )))
                                        .unwrap(),
                                )
                            }
                        },
                    );
                    let io = TokioIo::new(tls);
                    let _ = if h2 {
                        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(io, service)
                            .await
                    } else {
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, service)
                            .await
                    };
                });
            }
        });
        (address, ca.der().clone(), seen)
    }

    /// Direct calls go over TLS as reqwest's did: the certificate is verified (a server the
    /// client's roots do not vouch for is refused), and HTTP/2 is used where the server offers
    /// it by ALPN, HTTP/1.1 otherwise.
    #[tokio::test]
    async fn direct_calls_verify_tls_and_use_http2_where_offered() {
        use crate::provider::Provider;
        let provider_at = |address: std::net::SocketAddr, client: ProviderClient| {
            crate::openai::OpenAiProvider::new(
                "openai",
                crate::openai::Flavor::OpenAi,
                format!("https://localhost:{}/v1", address.port()),
                Some("sk-test-key-123".to_string().into()),
                client,
                Some(Duration::from_secs(10)),
            )
        };
        for (alpn, version) in [
            (
                vec![b"h2".to_vec(), b"http/1.1".to_vec()],
                http::Version::HTTP_2,
            ),
            (vec![b"http/1.1".to_vec()], http::Version::HTTP_11),
        ] {
            let (address, root, mut seen) = tls_provider(alpn).await;
            let trusting = ProviderClient::build(None, Some(vec![root])).unwrap();
            assert!(trusting.is_direct());
            let provider = provider_at(address, trusting);
            for _ in 0..2 {
                let answer = provider.infer(&hello()).await.unwrap();
                assert_eq!(answer.text, "over tls");
                assert_eq!(seen.recv().await, Some(version));
            }

            let untrusting = provider_at(address, ProviderClient::new(None).unwrap());
            match untrusting.infer(&hello()).await {
                Err(ProviderError::Connection { message, .. }) => {
                    assert!(message.to_lowercase().contains("certificate"), "{message}");
                }
                other => panic!("an unknown issuer was not refused: {other:?}"),
            }
            assert!(
                seen.try_recv().is_err(),
                "a refused server was sent a request"
            );
        }
    }

    #[test]
    fn calls_skip_reqwest_unless_the_environment_names_a_proxy() {
        assert_eq!(
            ProviderClient::new(None).unwrap().is_direct(),
            !proxy_in_environment()
        );
        assert!(!ProviderClient::via_reqwest(None).unwrap().is_direct());
        assert!(!ProviderClient::from(reqwest::Client::new()).is_direct());
    }

    /// An answer, a refusal with the provider's message and no key, a refused connection and
    /// a whole-call timeout read the same whichever way the call went.
    #[tokio::test]
    async fn both_transports_answer_refuse_and_fail_alike() {
        use crate::provider::Provider;
        use baton_testkit::{MockProvider, Reply};
        let mock = MockProvider::start().await.unwrap();
        for (how, client) in transports() {
            let provider = mock_openai(&mock, &client, Some(Duration::from_millis(500)));
            mock.push(Reply::text("hello there"));
            let answer = provider.infer(&hello()).await.unwrap();
            assert_eq!(answer.text, "hello there", "{how}");
            let sent = mock.received().pop().unwrap();
            assert_eq!(
                sent.headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok()),
                Some("Bearer sk-test-key-123"),
                "{how}"
            );
            assert_eq!(
                sent.headers.get("accept").and_then(|v| v.to_str().ok()),
                Some("*/*"),
                "{how}"
            );

            mock.push(Reply::Status {
                status: 401,
                message: "Incorrect API key provided: sk-test-key-123".into(),
                retry_after: None,
            });
            match provider.infer(&hello()).await {
                Err(ProviderError::Status {
                    status, message, ..
                }) => {
                    assert_eq!(status, 401, "{how}");
                    assert_eq!(message, "Incorrect API key provided: [redacted]", "{how}");
                }
                other => panic!("{how}: expected a 401, got {other:?}"),
            }

            mock.push(Reply::Delayed(
                Duration::from_secs(8),
                Box::new(Reply::text("late")),
            ));
            match provider.infer(&hello()).await {
                Err(error @ ProviderError::Timeout { .. }) => assert!(error.is_retryable()),
                other => panic!("{how}: expected a timeout, got {other:?}"),
            }

            // Nothing listens on a port just released.
            let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = closed.local_addr().unwrap().port();
            drop(closed);
            let nowhere = crate::openai::OpenAiProvider::new(
                "openai",
                crate::openai::Flavor::OpenAi,
                format!("http://127.0.0.1:{port}/v1"),
                None,
                client.clone(),
                None,
            );
            match nowhere.infer(&hello()).await {
                Err(error @ ProviderError::Connection { .. }) => {
                    assert!(error.is_retryable(), "{how}");
                    assert!(
                        !error.to_string().contains(&port.to_string()),
                        "{how}: {error}"
                    );
                }
                other => panic!("{how}: expected a connection error, got {other:?}"),
            }
        }
    }

    fn hello() -> baton_domain::chat::InferenceRequest {
        baton_domain::chat::InferenceRequest {
            model: "gpt-4o-mini".into(),
            messages: vec![baton_domain::chat::Message::text(
                baton_domain::chat::Role::User,
                "hi",
            )],
            ..Default::default()
        }
    }

    /// A stream whose body breaks, or ends, after the role chunk but before any content is
    /// a retryable failure (the chain moves on), as a refused connection is.
    #[tokio::test]
    async fn a_stream_cut_before_its_first_delta_is_retryable() {
        use crate::provider::Provider;
        use baton_testkit::{MockProvider, Reply};
        let mock = MockProvider::start().await.unwrap();
        for (how, client) in transports() {
            let provider = mock_openai(&mock, &client, None);
            for (what, reply) in [
                (
                    "broken",
                    Reply::BreakAfterFirstChunk(Box::new(Reply::text(""))),
                ),
                ("ended", Reply::TruncatedStream(Box::new(Reply::text("")))),
            ] {
                mock.push(reply);
                let Ok(stream) = provider.infer_stream(&hello()).await else {
                    panic!("{what}: the stream did not open");
                };
                let items: Vec<_> = stream.collect().await;
                match &items[..] {
                    [Err(error @ ProviderError::Connection { .. })] => {
                        assert!(error.is_retryable(), "{how} {what}");
                    }
                    other => {
                        panic!("{how} {what}: expected a connection error alone, got {other:?}")
                    }
                }
            }
        }
    }

    /// The provider's own timeout (synchronous calls' whole-call bound) bounds a stream's wait
    /// for its headers and for its first delta, as a retryable timeout; a stream that starts in
    /// time may run longer.
    #[tokio::test]
    async fn the_provider_timeout_bounds_a_stream_until_its_first_delta() {
        use crate::provider::Provider;
        use baton_testkit::{MockProvider, Reply};
        use std::time::Instant;
        let mock = MockProvider::start().await.unwrap();
        for (how, client) in transports() {
            let provider = mock_openai(&mock, &client, Some(Duration::from_millis(500)));
            let timed_out = |error: &ProviderError| {
                matches!(error, ProviderError::Timeout { .. }) && error.is_retryable()
            };

            mock.push(Reply::Delayed(
                Duration::from_secs(8),
                Box::new(Reply::text("late headers")),
            ));
            let started = Instant::now();
            match provider.infer_stream(&hello()).await {
                Err(error) => assert!(timed_out(&error), "{error:?}"),
                Ok(_) => panic!("headers after 8 s were waited for"),
            }
            assert!(started.elapsed() < Duration::from_secs(3));

            // Headers at once, then a byte every 100 ms: the first content is seconds away.
            mock.set_stream_chunking(8, Duration::from_millis(100));
            mock.push(Reply::text("a slow first token"));
            let started = Instant::now();
            let Ok(mut stream) = provider.infer_stream(&hello()).await else {
                panic!("the stream did not open");
            };
            match stream.next().await {
                Some(Err(error)) => assert!(timed_out(&error), "{error:?}"),
                other => panic!("expected a timeout, got {other:?}"),
            }
            assert!(started.elapsed() < Duration::from_secs(3));

            // The first content at once, the rest over more than the timeout: not cut.
            mock.set_stream_chunking(400, Duration::from_millis(300));
            mock.push(Reply::text("a long answer"));
            let started = Instant::now();
            let Ok(stream) = provider.infer_stream(&hello()).await else {
                panic!("the stream did not open");
            };
            let items: Vec<_> = stream.collect().await;
            assert!(started.elapsed() > Duration::from_millis(500));
            assert!(items.iter().all(Result::is_ok), "{how}: {items:?}");
            // The mock's own chunking again, for the other transport.
            mock.set_stream_chunking(7, Duration::ZERO);
        }
    }

    #[test]
    fn credentials_echoed_by_a_provider_are_scrubbed() {
        let request = reqwest::Client::new()
            .post("https://p.example/v1/x?key=AIza-query-secret&alt=sse")
            .bearer_auth("sk-bearer-secret")
            .header("x-api-key", "sk-ant-header-secret")
            .header("api-key", "short")
            .build()
            .unwrap();
        let secrets = credentials(&request);
        let err = ProviderError::Status {
            provider: "p".into(),
            status: 401,
            message: "Incorrect API key provided: sk-bearer-secret (Bearer sk-bearer-secret), \
                      sk-ant-header-secret, AIza-query-secret; short stays"
                .into(),
            retry_after: None,
        };
        let message = scrubbed(err, &secrets).to_string();
        for secret in [
            "sk-bearer-secret",
            "sk-ant-header-secret",
            "AIza-query-secret",
        ] {
            assert!(!message.contains(secret), "{message}");
        }
        assert!(message.contains("[redacted]"), "{message}");
        assert!(message.contains("short stays"), "{message}");
    }

    #[test]
    fn retryability() {
        let status = |s| ProviderError::Status {
            provider: "p".into(),
            status: s,
            message: String::new(),
            retry_after: None,
        };
        assert!(status(429).is_retryable());
        assert!(status(503).is_retryable());
        assert!(!status(400).is_retryable());
        assert!(!status(401).is_retryable());
        assert!(
            ProviderError::Timeout {
                provider: "p".into(),
                stage: "connect"
            }
            .is_retryable()
        );
    }
}
