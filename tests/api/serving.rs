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
