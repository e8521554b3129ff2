//! Network faults below HTTP: a server that resets every connection, and a TCP proxy that can
//! be paused (the database "going away" as the server under test sees it, without stopping a
//! database other tests share).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Accepts connections, reads the start of the request, then resets the connection (RST, no
/// response): a provider whose connection is reset.
pub struct ResetServer {
    address: SocketAddr,
}

impl ResetServer {
    pub async fn start() -> std::io::Result<ResetServer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = stream.read(&mut buf).await;
                    // Zero linger: closing sends RST rather than FIN.
                    let _ = stream.set_zero_linger();
                    drop(stream);
                });
            }
        });
        Ok(ResetServer { address })
    }

    /// Base URL for OpenAI-style configuration (`.../v1`).
    pub fn openai_base(&self) -> String {
        format!("http://{}/v1", self.address)
    }
}

/// A TCP proxy to `target`. While paused it refuses service (new connections are reset at
/// once) and cuts the connections it was carrying; resumed, it forwards again.
pub struct PausableProxy {
    address: SocketAddr,
    paused: Arc<AtomicBool>,
    /// Bumped on pause: every forwarding task of an older generation ends.
    generation: watch::Sender<u64>,
    connections: Arc<AtomicU64>,
}

impl PausableProxy {
    pub async fn start(target: SocketAddr) -> std::io::Result<PausableProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let paused = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let connections = Arc::new(AtomicU64::new(0));
        let (flag, gen_tx, count) = (paused.clone(), generation.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if flag.load(Ordering::SeqCst) {
                    let _ = client.set_zero_linger();
                    drop(client);
                    continue;
                }
                count.fetch_add(1, Ordering::SeqCst);
                let mut cut = gen_tx.subscribe();
                tokio::spawn(async move {
                    let Ok(upstream) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut client, mut upstream) = (client, upstream);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                        _ = cut.changed() => {
                            let _ = client.set_zero_linger();
                        }
                    }
                });
            }
        });
        Ok(PausableProxy {
            address,
            paused,
            generation,
            connections,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Cuts every open connection and refuses new ones until [`PausableProxy::resume`].
    pub fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Connections accepted and forwarded so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }
}
