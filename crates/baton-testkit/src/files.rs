//! A file host on a random loopback port: serves fixed bodies at fixed paths with a given
//! `content-type` (images a client links to, for providers that need them inline), 404
//! elsewhere, and counts the requests it answered.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

/// A body and its `content-type`, by path.
type Files = HashMap<String, (&'static str, Vec<u8>)>;

#[derive(Clone)]
struct Shared {
    files: Arc<Files>,
    requests: Arc<AtomicUsize>,
}

pub struct FileHost {
    address: SocketAddr,
    requests: Arc<AtomicUsize>,
}

impl FileHost {
    /// Serves each `(path, content-type, body)`.
    pub async fn start(files: &[(&str, &'static str, &[u8])]) -> std::io::Result<FileHost> {
        let files: Files = files
            .iter()
            .map(|(path, content_type, body)| ((*path).to_string(), (*content_type, body.to_vec())))
            .collect();
        let requests = Arc::new(AtomicUsize::new(0));
        let shared = Shared {
            files: Arc::new(files),
            requests: requests.clone(),
        };
        let router = Router::new().fallback(serve).with_state(shared);
        let address = crate::serve::serve_loopback(router).await?;
        Ok(FileHost { address, requests })
    }

    pub fn addr(&self) -> SocketAddr {
        self.address
    }

    /// `http://127.0.0.1:PORT<path>`
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    /// Requests answered so far, found or not.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

async fn serve(State(shared): State<Shared>, uri: Uri) -> Response {
    shared.requests.fetch_add(1, Ordering::SeqCst);
    match shared.files.get(uri.path()) {
        Some((content_type, body)) => {
            ([(header::CONTENT_TYPE, *content_type)], body.clone()).into_response()
        }
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
