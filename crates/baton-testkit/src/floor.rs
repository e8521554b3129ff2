//! The floor proxy: the thinnest gateway on Baton's own stack, for the load benchmark's
//! `floor` column. It does what every gateway must (accept, read the body, call the provider
//! over a pooled keep-alive connection, relay the answer as it arrives) and nothing else: no
//! routing, auth, parsing, logging or cost. What it adds over the direct path is what this
//! machine charges for the extra hop, a floor no gateway gets under; what Baton adds beyond it
//! is Baton's own work.
//!
//! Built like Baton's serving: one thread per core, each a single-threaded runtime accepting
//! on its own `SO_REUSEPORT` listener and calling through its own reqwest pool.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

type ProxyBody = Either<reqwest::Body, Full<Bytes>>;

/// Binds `threads` listeners on one loopback port and serves each on a thread of its own,
/// forwarding every request's path to `upstream` (`http://host:port`). Returns the address;
/// the threads serve until the process ends.
pub fn spawn(upstream: String, threads: usize) -> io::Result<SocketAddr> {
    let upstream: Arc<str> = upstream.trim_end_matches('/').into();
    crate::serve::on_port_threads("floor", threads, move |listener| {
        let upstream = upstream.clone();
        async move {
            let _ = serve(listener, upstream).await;
        }
    })
}

async fn serve(listener: std::net::TcpListener, upstream: Arc<str>) -> io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    // As Baton's provider pools (`baton-providers/src/http.rs`).
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .build()
        .map_err(io::Error::other)?;
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of descriptors under overload: back off rather than spin.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (client, upstream) = (client.clone(), upstream.clone());
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let (client, upstream) = (client.clone(), upstream.clone());
                async move { Ok::<_, Infallible>(forward(&client, &upstream, request).await) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn forward(
    client: &reqwest::Client,
    upstream: &str,
    request: Request<Incoming>,
) -> Response<ProxyBody> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(body) => body.to_bytes(),
        Err(err) => return failure(StatusCode::BAD_REQUEST, &err.to_string()),
    };
    let mut call = client
        .request(parts.method, format!("{upstream}{}", parts.uri.path()))
        .body(body);
    for name in [hyper::header::CONTENT_TYPE, hyper::header::AUTHORIZATION] {
        if let Some(value) = parts.headers.get(&name) {
            call = call.header(name, value);
        }
    }
    match call.send().await {
        Ok(answer) => Response::from(answer).map(Either::Left),
        Err(err) => failure(StatusCode::BAD_GATEWAY, &err.to_string()),
    }
}

fn failure(status: StatusCode, message: &str) -> Response<ProxyBody> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(message.to_owned()))));
    *response.status_mut() = status;
    response
}
