//! What every adapter does over HTTP: one tuned client per provider, sending, and turning
//! failures into [`ProviderError`]s that keep the provider's message and no credential.

use std::cell::Cell;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use reqwest::{RequestBuilder, Response, StatusCode};
use serde_json::Value;

use crate::error::{ProviderError, ProviderResult};
use crate::provider::{DeltaStream, require_finish};

const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Error bodies beyond this are cut: they are read only for their message.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Idle keep-alive connections kept per provider host. At least the concurrency a gateway is
/// driven at (the load benchmark opens 1,000 streams at once): with fewer, every connection
/// past the bound was closed after its call and the next call reconnected, which a profile at
/// 1,000 RPS showed at ~13% of CPU once the machine was saturated. An idle connection costs a
/// socket and a few KB; the pool's idle timeout closes those a burst left behind.
const POOL_MAX_IDLE_PER_HOST: usize = 1024;

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
    /// Slot 0's pool: the thread that did not pick a slot (tests, admin commands, the main
    /// runtime), and the fallback when another slot's pool cannot be built.
    first: reqwest::Client,
    others: Box<[OnceLock<reqwest::Client>]>,
    connect_timeout: Duration,
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
    /// A pool per serving thread, each built on its first use.
    pub fn new(connect_timeout: Option<Duration>) -> ProviderResult<ProviderClient> {
        let connect_timeout = connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        Ok(ProviderClient {
            slots: Arc::new(ClientSlots {
                first: build_client(connect_timeout)?,
                others: (1..POOL_SLOTS).map(|_| OnceLock::new()).collect(),
                connect_timeout,
            }),
        })
    }

    /// The calling thread's pool.
    pub fn get(&self) -> &reqwest::Client {
        let slots = &*self.slots;
        let slot = CLIENT_SLOT.with(Cell::get);
        if slot == 0 || slots.others.is_empty() {
            return &slots.first;
        }
        slots.others[(slot - 1) % slots.others.len()].get_or_init(|| {
            // Building failed where the first pool's build succeeded: share that pool.
            build_client(slots.connect_timeout).unwrap_or_else(|_| slots.first.clone())
        })
    }
}

/// A client given by the caller (tests, benchmarks): every thread shares its pool.
impl From<reqwest::Client> for ProviderClient {
    fn from(client: reqwest::Client) -> Self {
        ProviderClient {
            slots: Arc::new(ClientSlots {
                first: client,
                others: Box::new([]),
                connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            }),
        }
    }
}

impl std::fmt::Debug for ProviderClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderClient")
            .field("pools", &(1 + self.slots.others.len()))
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
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
        .build()
        .map_err(|e| ProviderError::Connection {
            provider: "http client".into(),
            message: e.to_string(),
        })
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

/// Sends a request and returns the response if its status is a success.
pub async fn send(
    provider: &str,
    model: &str,
    request: RequestBuilder,
) -> ProviderResult<Response> {
    execute(provider, model, request)
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
    provider: &str,
    model: &str,
    request: RequestBuilder,
    timeout: Option<Duration>,
    parse: impl FnOnce(Response) -> DeltaStream,
) -> ProviderResult<DeltaStream> {
    let by = timeout.map(|limit| tokio::time::Instant::now() + limit);
    let (response, secrets) = match by {
        Some(by) => tokio::time::timeout_at(by, execute(provider, model, request))
            .await
            .map_err(|_| ProviderError::Timeout {
                provider: provider.to_string(),
                stage: "headers, provider timeout",
            })??,
        None => execute(provider, model, request).await?,
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
    provider: &str,
    model: &str,
    request: RequestBuilder,
) -> ProviderResult<(Response, Vec<String>)> {
    let (client, request) = request.build_split();
    let request = request.map_err(|e| transport_error(provider, e))?;
    let secrets = credentials(&request);
    let response = client
        .execute(request)
        .await
        .map_err(|e| transport_error(provider, e))?;
    if response.status().is_success() {
        Ok((response, secrets))
    } else {
        Err(scrubbed(
            status_error(provider, model, response).await,
            &secrets,
        ))
    }
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
    provider: &str,
    model: &str,
    request: RequestBuilder,
    timeout: Option<Duration>,
) -> ProviderResult<T> {
    let request = match timeout {
        Some(timeout) => request.timeout(timeout),
        None => request,
    };
    let response = send(provider, model, request).await?;
    let bytes = response
        .bytes()
        .await
        .map_err(|e| transport_error(provider, e))?;
    decode(provider, &bytes)
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

async fn status_error(provider: &str, model: &str, response: Response) -> ProviderError {
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

async fn read_capped(mut response: Response, cap: usize) -> Vec<u8> {
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
                    let first = std::ptr::from_ref(client.get()) as usize;
                    assert_eq!(std::ptr::from_ref(client.get()) as usize, first);
                    first
                })
                .join()
                .unwrap()
        })
    }

    #[test]
    fn each_serving_thread_calls_through_its_own_pool() {
        let client = ProviderClient::new(None).unwrap();
        let unset = std::ptr::from_ref(client.get()) as usize;
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
            std::ptr::from_ref(given.get()) as usize
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
            reqwest::Client::new(),
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
        timeout: Option<Duration>,
    ) -> crate::openai::OpenAiProvider {
        crate::openai::OpenAiProvider::new(
            "openai",
            crate::openai::Flavor::OpenAi,
            mock.openai_base(),
            Some("sk-test-key-123".to_string().into()),
            reqwest::Client::new(),
            timeout,
        )
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
        let provider = mock_openai(&mock, None);
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
                    assert!(error.is_retryable(), "{what}");
                }
                other => panic!("{what}: expected a connection error alone, got {other:?}"),
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
        let provider = mock_openai(&mock, Some(Duration::from_millis(500)));
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
        assert!(items.iter().all(Result::is_ok), "{items:?}");
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
