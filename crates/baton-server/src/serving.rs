//! Thread-per-core serving: one single-threaded runtime per serving thread, each accepting on
//! its own listener of one `SO_REUSEPORT` group (the kernel spreads new connections across
//! them), each calling providers through its own connection pools.
//!
//! The runtime that built the application (the binary's main thread) serves no requests: it
//! runs the background work (the invocation-log writer, sweeps, alert delivery), so a batch
//! being prepared never delays a request.
//!
//! A connection is served start to finish on one thread: its request, the provider call,
//! every streamed chunk and the response. On a work-stealing runtime the same request hopped
//! between workers (the provider connection's task on one, the request's on another) and
//! workers parked and woke each other between requests; at one request at a time that was a
//! third of the CPU and most of the added latency (`docs/performance.md`, "Thread per core").

use std::io;
use std::net::SocketAddr;
use std::thread::JoinHandle;

use baton_api::AppState;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

use crate::runtime_thread;

/// Connections a listener queues before accepting (the kernel caps it at `somaxconn`).
const BACKLOG: i32 = 4096;

/// Binds `bind` for `threads` serving threads: a listener each, all on one port.
pub(crate) fn bind(bind: SocketAddr, threads: usize) -> io::Result<Vec<std::net::TcpListener>> {
    if threads <= 1 || !cfg!(unix) {
        let listener = std::net::TcpListener::bind(bind)?;
        listener.set_nonblocking(true)?;
        return Ok(vec![listener]);
    }
    // A plain bind first, so an address another process listens on is refused as it would be
    // without SO_REUSEPORT (which would let a second Baton of the same user share the port and
    // take part of its connections). It also settles port 0 for the whole group.
    let address = std::net::TcpListener::bind(bind)?.local_addr()?;
    (0..threads).map(|_| reuse_port_listener(address)).collect()
}

fn reuse_port_listener(address: SocketAddr) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(address), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    #[cfg(unix)]
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// The serving threads.
pub(crate) struct ServingThreads {
    /// `true`: stop accepting and drain. Dropped: the threads end (their runtimes with them).
    stop: watch::Sender<bool>,
    /// `true`: drop the connections still open.
    abort: watch::Sender<bool>,
    /// One a thread, taken once it has drained.
    drained: Vec<Option<oneshot::Receiver<io::Result<()>>>>,
    handles: Vec<JoinHandle<()>>,
}

/// Starts a serving thread per listener, serving `router` until [`ServingThreads::stop`];
/// returns once every thread serves (or with the first one's failure to start).
pub(crate) async fn spawn(
    listeners: Vec<std::net::TcpListener>,
    router: &baton_api::Router,
    state: &AppState,
) -> io::Result<ServingThreads> {
    let (stop, stop_rx) = watch::channel(false);
    let (abort, abort_rx) = watch::channel(false);
    let mut threads = ServingThreads {
        stop,
        abort,
        drained: Vec::new(),
        handles: Vec::new(),
    };
    let mut started = Vec::new();
    for (index, listener) in listeners.into_iter().enumerate() {
        let thread = Thread {
            // Provider pool slot 0 is the other threads' (`use_client_slot`).
            slot: index + 1,
            router: router.clone(),
            state: state.clone(),
            stop: stop_rx.clone(),
            abort: abort_rx.clone(),
        };
        let (ready, ready_rx) = oneshot::channel();
        let (drained, drained_rx) = oneshot::channel();
        let slot = thread.slot;
        let handle = runtime_thread::spawn(
            format!("baton-serve-{index}"),
            move || baton_providers::http::use_client_slot(slot),
            ready,
            move |_, ready| thread.serve(listener, ready, drained),
        )?;
        started.push(ready_rx);
        threads.drained.push(Some(drained_rx));
        threads.handles.push(handle);
    }
    for ready in started {
        ready
            .await
            .map_err(|_| io::Error::other("a serving thread ended at start"))??;
    }
    Ok(threads)
}

/// What one serving thread serves with.
struct Thread {
    slot: usize,
    router: baton_api::Router,
    state: AppState,
    stop: watch::Receiver<bool>,
    abort: watch::Receiver<bool>,
}

impl Thread {
    async fn serve(
        self,
        listener: std::net::TcpListener,
        ready: oneshot::Sender<io::Result<()>>,
        drained: oneshot::Sender<io::Result<()>>,
    ) {
        let listener = match TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(err) => {
                let _ = ready.send(Err(err));
                return;
            }
        };
        self.state.start_runtime_tasks();
        let _ = ready.send(Ok(()));
        let mut stopping = self.stop.clone();
        let mut aborting = self.abort;
        let options = self.state.config.connections;
        let stopped = async move {
            // A dropped sender (the application went away without stopping) stops too.
            let _ = stopping.wait_for(|stop| *stop).await;
        };
        let aborted = async move {
            // A dropped sender is not an abort: the threads are ended another way then.
            if aborting.wait_for(|abort| *abort).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let result = baton_api::serve(listener, self.router, options, stopped, aborted).await;
        // Runs dropped by an abort log themselves from tasks spawned on this runtime: let them
        // queue their rows before the application closes the log writer.
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        let _ = drained.send(result);
        // Connections this runtime opened (a database pool's among them) stay usable until
        // the application has written its last log rows and closed the database.
        let mut stop = self.stop;
        while stop.changed().await.is_ok() {}
    }
}

impl ServingThreads {
    /// Tells every thread to stop accepting and finish its requests.
    pub(crate) fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Drops every connection still open (the grace period is over).
    pub(crate) fn abort(&self) {
        self.abort.send_replace(true);
    }

    /// Waits until every thread has finished its requests; the first error, if any. Cancelled
    /// (the grace period ran out), it can be called again for the threads still serving.
    pub(crate) async fn drained(&mut self) -> io::Result<()> {
        let mut result = Ok(());
        for slot in &mut self.drained {
            let Some(drained) = slot else { continue };
            let outcome = drained.await;
            *slot = None;
            if let Ok(Err(err)) = outcome
                && result.is_ok()
            {
                result = Err(err);
            }
        }
        result
    }

    /// Ends the threads and their runtimes (dropping whatever they still serve).
    pub(crate) async fn end(self) {
        drop(self.stop);
        let handles = self.handles;
        let joined = tokio::task::spawn_blocking(move || {
            handles
                .into_iter()
                .map(JoinHandle::join)
                .filter(Result::is_err)
                .count()
        })
        .await;
        if !matches!(joined, Ok(0)) {
            tracing::error!("a serving thread panicked");
        }
    }
}
