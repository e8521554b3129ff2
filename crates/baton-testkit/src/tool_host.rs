//! A mock External-tool host: an HTTP server on a random loopback port that records every
//! request and answers a few routes useful to tool-call tests.
//!
//! - `GET /echo` (and any path not listed here): 200 with JSON `{path, query, headers}`, the
//!   query as `[name, value]` pairs in order, and the `x-*` and `authorization` headers;
//! - `GET /sleep?ms=N`: waits N ms, then answers `slept`;
//! - `GET /big?bytes=N`: N bytes with a Content-Length;
//! - `GET /big-chunked?bytes=N`: N bytes streamed in chunks, without a Content-Length (counted
//!   as they are produced: [`ToolHost::streamed_bytes`]);
//! - `GET /status/{code}`: that status with a short body (`?bytes=N` pads it to N bytes).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

/// Chunk size of `/big-chunked`: small enough that a capped reader sees many chunks.
const CHUNK: usize = 16 * 1024;

/// One request as the host saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    pub path: String,
    /// Decoded query pairs, in order (repeated names stay repeated).
    pub query: Vec<(String, String)>,
    /// Every header, names lowercase.
    pub headers: Vec<(String, String)>,
}

impl SeenRequest {
    /// The first value of a header (`name` in any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a query parameter, in order.
    pub fn query_values(&self, name: &str) -> Vec<&str> {
        self.query
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<SeenRequest>>>, Arc<AtomicU64>);

impl Seen {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SeenRequest>> {
        // A test that panicked while holding the lock already failed; keep serving.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The mock tool host. Dropping it does not stop the server; the test runtime does.
pub struct ToolHost {
    address: SocketAddr,
    seen: Seen,
}

impl ToolHost {
    pub async fn start() -> std::io::Result<ToolHost> {
        let seen = Seen::default();
        let router = Router::new().fallback(handle).with_state(seen.clone());
        let address = crate::serve::serve_loopback(router).await?;
        Ok(ToolHost { address, seen })
    }

    pub fn addr(&self) -> SocketAddr {
        self.address
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn origin(&self) -> String {
        format!("http://{}", self.address)
    }

    /// The requests received so far, oldest first.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.seen.lock().clone()
    }

    /// Bytes of `/big-chunked` bodies produced so far. Chunks are produced as the connection
    /// takes them, so a client that stops reading (and closes) leaves this below what it asked
    /// for, give or take what the socket buffers held.
    pub fn streamed_bytes(&self) -> u64 {
        self.seen.1.load(Ordering::SeqCst)
    }
}

async fn handle(State(seen): State<Seen>, request: Request) -> Response {
    let path = request.uri().path().to_string();
    let query: Vec<(String, String)> = request
        .uri()
        .query()
        .map(url_decode_pairs)
        .unwrap_or_default();
    let headers: Vec<(String, String)> = request
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_string(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    let seen_request = SeenRequest {
        path: path.clone(),
        query,
        headers,
    };
    seen.lock().push(seen_request.clone());

    let number = |name: &str| -> usize {
        seen_request
            .query_values(name)
            .first()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    if path == "/sleep" {
        tokio::time::sleep(Duration::from_millis(number("ms") as u64)).await;
        return "slept".into_response();
    }
    if path == "/big" {
        return vec![b'x'; number("bytes")].into_response();
    }
    if path == "/big-chunked" {
        let total = number("bytes");
        let streamed = seen.1.clone();
        // A stream body has no size hint, so hyper sends it chunked, without Content-Length.
        let chunks = (0..total.div_ceil(CHUNK)).map(move |i| {
            let size = CHUNK.min(total - i * CHUNK);
            streamed.fetch_add(size as u64, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; size]))
        });
        return Response::builder()
            .header(header::CONTENT_TYPE, "text/plain")
            .body(Body::from_stream(futures::stream::iter(chunks)))
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    if let Some(code) = path.strip_prefix("/status/") {
        let Some(status) = code
            .parse::<u16>()
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
        else {
            return (StatusCode::BAD_REQUEST, "not a status code").into_response();
        };
        let mut body = format!("status {} from the tool host", status.as_u16());
        let pad = number("bytes");
        if pad > body.len() {
            body.push_str(&"e".repeat(pad - body.len()));
        }
        return (status, body).into_response();
    }
    echo(&seen_request).into_response()
}

fn echo(request: &SeenRequest) -> axum::Json<Value> {
    let headers: Map<String, Value> = request
        .headers
        .iter()
        .filter(|(name, _)| name.starts_with("x-") || name == "authorization")
        .map(|(name, value)| (name.clone(), Value::from(value.as_str())))
        .collect();
    let query: Vec<Value> = request.query.iter().map(|(n, v)| json!([n, v])).collect();
    axum::Json(json!({"path": request.path, "query": query, "headers": headers}))
}

/// `application/x-www-form-urlencoded` pairs (`+` is a space), as a server framework reads them.
fn url_decode_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(name), decode(value))
        })
        .collect()
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(byte) => {
                        out.push(byte);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            other => {
                out.push(other);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
