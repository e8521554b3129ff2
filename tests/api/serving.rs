//! Thread-per-core serving (`server.threads`): listeners of one `SO_REUSEPORT` group, each
//! served by a thread of its own with its own provider connection pools.

use serde_json::json;

use crate::chat::app_with_mock_and;
use crate::helpers::send;

const REQUESTS: usize = 30;

#[tokio::test]
async fn new_connections_spread_over_the_threads_each_calling_through_its_own_pool() {
    let (app, mock) = app_with_mock_and(|config| config.server.threads = 3).await;
    let key = app.default_tenant.api_key.clone();
    for n in 0..REQUESTS {
        // A client per request: a new connection each time, placed by the kernel.
        let client = reqwest::Client::new();
        let response = send(
            client
                .post(app.url("/api/v1/chat/completions"))
                .bearer_auth(&key)
                .json(&json!({"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": format!("hi {n}")}]})),
        )
        .await;
        assert_eq!(response.status, 200, "{}", response.text);
    }
    // One after another, the calls of one thread reuse its pool's keep-alive connection: the
    // provider sees a connection per thread that served any (30 connections over 3 listeners
    // all landing on one has odds of 3 in 3^30), never one per request.
    let upstream = mock.connections();
    assert!(
        (2..=3).contains(&upstream),
        "{upstream} provider connections for {REQUESTS} requests on 3 threads"
    );

    let tenant = baton_store::TenantId::new(app.default_tenant.id.clone());
    let db = app.stop_keeping_database().await;
    let direct = baton_store::Store::connect(&baton_store::StoreOptions::new(db.url()))
        .await
        .unwrap();
    assert_eq!(direct.list_runs(&tenant).await.unwrap().len(), REQUESTS);
}

#[tokio::test]
async fn an_address_another_server_listens_on_is_refused() {
    let (app, _mock) = app_with_mock_and(|config| config.server.threads = 2).await;
    let taken: std::net::SocketAddr = app.address.trim_start_matches("http://").parse().unwrap();
    let db = crate::helpers::TestDatabase::new().await;
    let mut config = baton_server::Config::for_database(&db.url()).unwrap();
    config.bind = taken;
    config.server.threads = 2;
    // Both use SO_REUSEPORT as the same user; the kernel would let the second share the port.
    let err = match baton_server::Application::build(&config).await {
        Ok(_) => panic!("a second server bound {taken}"),
        Err(err) => err.to_string(),
    };
    assert!(err.contains("in use"), "{err}");
    app.stop().await;
}

/// A raw connection to `app` that has sent `bytes` (nothing when empty).
async fn connected(app: &crate::helpers::TestApp, bytes: &[u8]) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let address = app.address.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    stream
}

const HEALTH_REQUEST: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: baton\r\n\r\n";

/// Reads until the server closes the connection; what it sent before closing. Panics if it
/// keeps the connection open for a minute (the deadline under test is a second).
async fn read_until_closed(stream: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut received = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        stream.read_to_end(&mut received),
    )
    .await
    .expect("the server kept the connection open past its header deadline");
    // A reset (the server closing with our bytes unread) is a close too.
    if let Err(err) = read {
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    }
    received
}

#[tokio::test]
async fn connections_that_do_not_send_their_headers_in_time_are_closed() {
    let app = crate::helpers::spawn_app_with(|config| {
        config.server.header_read_timeout_secs = 1;
        config.server.threads = 2;
    })
    .await;
    // Connects and sends nothing.
    let mut silent = connected(&app, b"").await;
    // Starts a request and stalls mid-headers (a slow-header client).
    let mut stalled = connected(&app, b"GET /healthz HTTP/1.1\r\nHost: baton\r\nX-Slow: ").await;
    // Sends a whole request, then idles on the kept-alive connection.
    let mut idle = connected(&app, HEALTH_REQUEST).await;

    assert!(read_until_closed(&mut silent).await.is_empty());
    assert!(read_until_closed(&mut stalled).await.is_empty());
    let answered = String::from_utf8(read_until_closed(&mut idle).await).unwrap();
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    // One response: the connection was closed while idle, not after a second request.
    assert_eq!(answered.matches("HTTP/1.1").count(), 1, "{answered}");

    // A client that sends in time is served as before, on a fresh connection.
    let response = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    app.stop().await;
}

#[tokio::test]
async fn a_request_slower_than_the_header_deadline_is_answered_on_its_connection() {
    use baton_testkit::Reply;
    use std::time::Duration;

    let (app, mock) = app_with_mock_and(|config| config.server.header_read_timeout_secs = 1).await;
    // The deadline covers reading a request's headers, not the time Baton takes to answer.
    mock.push(Reply::Delayed(
        Duration::from_millis(2500),
        Box::new(Reply::text("slow but sure")),
    ));
    mock.push(Reply::text("and again"));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()
        .unwrap();
    for expected in ["slow but sure", "and again"] {
        let response = send(
            client
                .post(app.url("/api/v1/chat/completions"))
                .bearer_auth(&app.default_tenant.api_key)
                .json(&json!({"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})),
        )
        .await;
        assert_eq!(response.status, 200, "{}", response.text);
        assert!(response.text.contains(expected), "{}", response.text);
    }
    app.stop().await;
}

#[tokio::test]
async fn stopping_closes_idle_kept_alive_connections_at_once() {
    use tokio::io::AsyncReadExt;

    // Neither the header deadline nor the grace period could close the connection in time:
    // only the drain's closing of idle connections does.
    let app = crate::helpers::spawn_app_with(|config| {
        config.server.threads = 1;
        config.server.shutdown_grace_secs = 600;
    })
    .await;
    let mut idle = connected(&app, HEALTH_REQUEST).await;
    let mut head = [0u8; 12];
    idle.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");

    let stop = tokio::spawn(app.stop());
    read_until_closed(&mut idle).await;
    stop.await.unwrap();
}

#[tokio::test]
async fn a_request_outliving_the_grace_period_is_dropped_and_still_logged() {
    use baton_testkit::Reply;
    use std::time::Duration;

    let (app, mock) = app_with_mock_and(|config| config.server.shutdown_grace_secs = 1).await;
    mock.push(Reply::Delayed(
        Duration::from_secs(5),
        Box::new(Reply::text("too late")),
    ));
    let tenant = baton_store::TenantId::new(app.default_tenant.id.clone());
    let request = app
        .client
        .post(app.url("/api/v1/chat/completions"))
        .bearer_auth(&app.default_tenant.api_key)
        .json(&json!({"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}))
        .send();
    let request = tokio::spawn(request);
    while mock.received().is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The grace period runs out while the provider still thinks: the connection is dropped
    // (not answered after the log writer closed), and the run is in the log all the same.
    let db = app.stop_keeping_database().await;
    assert!(
        request.await.unwrap().is_err(),
        "the connection was dropped"
    );
    let store = baton_store::Store::connect(&baton_store::StoreOptions::new(db.url()))
        .await
        .unwrap();
    let runs = store.list_runs(&tenant).await.unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].status, baton_domain::run::RunStatus::Failed);
    // Cut by the service, not by its client.
    assert_eq!(runs[0].error_code.as_deref(), Some("SERVICE_SHUTDOWN"));
    store.close().await.unwrap();
}
