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

/// Binds one loopback port and serves `router` on `threads` threads, each a single-threaded
/// runtime accepting on its own `SO_REUSEPORT` listener (the kernel spreads connections over
/// them), as Baton serves. A thread per core costs no more CPU a request than one thread (no
/// work stealing, no hand-off between threads), so a mock given two cores can serve twice as
/// much without taking CPU from the gateway in front of it. The threads serve until the
/// process ends.
pub fn serve_loopback_threads(router: Router, threads: usize) -> std::io::Result<SocketAddr> {
    on_port_threads("mock", threads, move |listener| {
        let router = router.clone();
        async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let _ = axum::serve(listener, router).await;
        }
    })
}

/// Binds one loopback port and runs `serve` on `threads` threads named `name-N`, each on a
/// single-threaded runtime with its own `SO_REUSEPORT` listener of that port. Returns the
/// address; the threads serve until the process ends.
pub(crate) fn on_port_threads<F, Fut>(
    name: &str,
    threads: usize,
    serve: F,
) -> std::io::Result<SocketAddr>
where
    F: Fn(std::net::TcpListener) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let address = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    for index in 0..threads.max(1) {
        let listener = reuse_port_listener(address)?;
        let serve = serve.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name(format!("{name}-{index}"))
            .spawn(move || runtime.block_on(serve(listener)))?;
    }
    Ok(address)
}

/// A listener on `address` that shares its port with the others bound the same way.
fn reuse_port_listener(address: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(address), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    socket.listen(BACKLOG as i32)?;
    Ok(socket.into())
}
