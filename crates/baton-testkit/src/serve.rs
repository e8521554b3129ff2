//! How every testkit server listens: a fresh loopback port, TCP_NODELAY on each accepted socket.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::serve::ListenerExt;

/// Connections a testkit server queues before accepting (the kernel caps it at `somaxconn`).
const BACKLOG: u32 = 4096;

/// Binds `127.0.0.1:0`, serves `router` on a spawned task and returns the address. Without
/// TCP_NODELAY, Nagle holds each small write after the first (a stream's chunks, a response
/// body after its head) until the client's delayed ACK, about 40 ms on Linux: latencies and
/// streamed TTFT measured against a mock would measure that instead.
pub(crate) async fn serve_loopback(router: Router) -> std::io::Result<SocketAddr> {
    serve_loopback_counting(router, Arc::default()).await
}

/// [`serve_loopback`], counting the TCP connections it accepts into `connections`.
pub(crate) async fn serve_loopback_counting(
    router: Router,
    connections: Arc<AtomicUsize>,
) -> std::io::Result<SocketAddr> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    // tokio's `bind` queues 1,024 connections: the load bench's 1,000 streams opened at once
    // (on top of connections from earlier phases) overflowed it, and the dropped SYNs were
    // retried after a second, which made the direct baseline's TTFT tail a second long.
    let listener = socket.listen(BACKLOG)?;
    let address = listener.local_addr()?;
    let listener = listener.tap_io(move |tcp| {
        connections.fetch_add(1, Ordering::Relaxed);
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(address)
}
