//! One bare keep-alive HTTP/1.1 connection, for the closed-loop phases (concurrency 1 and N).
//!
//! On two vCPUs the driver shares the machine with the mock and the gateway, so what it spends
//! per request is taken from the gateway's throughput. Through reqwest each request pays for a
//! pool checkout, the URL parsed three times and its tower stack; a worker that owns one hyper
//! connection and sends one prepared request does not (the direct closed loop ran 55% faster
//! with it: docs/benchmarks.md, "The driver"). Open-loop phases and streams keep reqwest: they
//! need a pool (any number of requests in flight) and chunk-by-chunk reads.

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use super::driver::{REQUEST_TIMEOUT, Target, answered};

/// A worker's connection to one target's plain (unstreamed) endpoint, opened on first use and
/// again after a failure.
pub struct Connection {
    /// `host:port`, for connecting and for the `Host` header.
    authority: String,
    host: HeaderValue,
    path: Uri,
    authorization: Option<HeaderValue>,
    body: Bytes,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Connection {
    pub fn new(target: &Target) -> anyhow::Result<Connection> {
        let uri: Uri = target.url.parse()?;
        let authority = uri
            .authority()
            .ok_or_else(|| anyhow::anyhow!("{} has no host", target.url))?
            .to_string();
        let path = uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse::<Uri>()?;
        let authorization = target
            .key
            .as_ref()
            .map(|key| HeaderValue::try_from(format!("Bearer {key}")))
            .transpose()?;
        Ok(Connection {
            host: HeaderValue::try_from(authority.as_str())?,
            authority,
            path,
            authorization,
            body: Bytes::copy_from_slice(target.body.as_bytes()),
            sender: None,
        })
    }

    /// One request read to its end, as [`super::driver::send`] does through reqwest.
    pub async fn send(&mut self) -> Result<(), String> {
        let result = tokio::time::timeout(REQUEST_TIMEOUT, self.exchange())
            .await
            .unwrap_or_else(|_| Err("timed out".to_string()));
        if result.is_err() {
            // The connection may be mid-response: start the next request on a new one.
            self.sender = None;
        }
        result
    }

    async fn exchange(&mut self) -> Result<(), String> {
        let sender = match &mut self.sender {
            Some(sender) if !sender.is_closed() => sender,
            slot => slot.insert(connect(&self.authority).await?),
        };
        sender.ready().await.map_err(|e| e.to_string())?;
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(self.path.clone())
            .header(HOST, self.host.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            // What reqwest sends, so every phase's requests look the same to a server.
            .header(ACCEPT, HeaderValue::from_static("*/*"));
        if let Some(authorization) = &self.authorization {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        let request = request
            .body(Full::new(self.body.clone()))
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        answered(status, &body)
    }
}

async fn connect(authority: &str) -> Result<SendRequest<Full<Bytes>>, String> {
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| format!("connect {authority}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    // Ends when the sender is dropped or the server closes the connection.
    tokio::spawn(connection);
    Ok(sender)
}
