//! Accepting and serving connections: HTTP/1.1 through hyper, with a deadline on every
//! request's headers and a graceful drain.
//!
//! Not `axum::serve`: it installs no timer in hyper, so a connection that sends nothing, sends
//! its headers a byte at a time, or sits idle between keep-alive requests held its task,
//! socket and buffers (~25 KB) until the client hung up (`docs/decisions.md`, "Connection
//! deadlines").

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::serve::{Listener, ListenerExt};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// How accepted connections are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// How long a connection has to send a request's headers, counted from when it connects
    /// and, on a kept-alive connection, from its previous response (hyper arms one timer for
    /// both): past it the connection is closed. `None`: no deadline.
    pub header_read_timeout: Option<Duration>,
}

/// `server.header_read_timeout_secs` unless configured: hyper's own default, nginx's
/// `client_header_timeout` is 60 s and Node's `keepAliveTimeout` 5 s.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            header_read_timeout: Some(DEFAULT_HEADER_READ_TIMEOUT),
        }
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, then stops accepting, closes idle
/// connections and lets in-flight requests finish; returns when every connection has closed,
/// or when `abort` resolves: then every connection still open is dropped, and with it its
/// requests (a run cut short this way is logged as failed by its own drop), before it returns.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
    abort: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Responses are small and latency-bound: send them without Nagle's delay.
    let mut listener = listener.tap_io(|tcp| {
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(error = %err, "could not set TCP_NODELAY");
        }
    });
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout);
    let connections = GracefulShutdown::new();
    // Owned here, so that an abort can drop them and wait until they are gone.
    let mut tasks = tokio::task::JoinSet::new();
    let mut shutdown = pin!(shutdown);
    loop {
        // `Listener::accept` retries what a client caused and backs off on what it did not
        // (out of file descriptors), as `axum::serve` does.
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(router.clone().map_request(
            move |request: axum::http::Request<Incoming>| {
                let mut request = request.map(Body::new);
                request.extensions_mut().insert(ConnectInfo(remote));
                request
            },
        ));
        let connection = connections.watch(http.serve_connection(TokioIo::new(stream), service));
        // Finished connections are reaped as new ones come, so the set stays as large as the
        // connections open.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(async move {
            if let Err(err) = connection.await {
                // A client going away, or missing the header deadline: nothing to act on.
                tracing::trace!(error = %err, %remote, "connection ended");
            }
        });
    }
    drop(listener);
    tokio::select! {
        () = connections.shutdown() => {}
        () = abort => tasks.shutdown().await,
    }
    Ok(())
}
