//! A webhook receiver on a random loopback port: records every POST (headers and body) and can
//! answer 500 to the first N, to exercise a sender's retries.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};

/// One delivery as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Every header, names lowercase.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The status the receiver answered.
    pub status: u16,
}

impl Delivery {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Inbox {
    deliveries: Vec<Delivery>,
    fail_first: usize,
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Inbox>>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

pub struct WebhookReceiver {
    address: SocketAddr,
    shared: Shared,
}

impl WebhookReceiver {
    /// A receiver that answers 500 to its first `fail_first` requests, then 200.
    pub async fn start(fail_first: usize) -> std::io::Result<WebhookReceiver> {
        let shared = Shared::default();
        shared.lock().fail_first = fail_first;
        let router = Router::new().fallback(receive).with_state(shared.clone());
        let address = crate::serve::serve_loopback(router).await?;
        Ok(WebhookReceiver { address, shared })
    }

    pub fn addr(&self) -> SocketAddr {
        self.address
    }

    /// `http://127.0.0.1:PORT/hook`
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.address)
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        self.shared.lock().deliveries.clone()
    }
}

async fn receive(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let mut inbox = shared.lock();
    let status = if inbox.deliveries.len() < inbox.fail_first {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    };
    inbox.deliveries.push(Delivery {
        headers: headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_string(),
                    v.to_str().unwrap_or_default().to_string(),
                )
            })
            .collect(),
        body: body.to_vec(),
        status: status.as_u16(),
    });
    status
}
