use std::path::PathBuf;

use baton_server::config::Config;
use baton_server::{Application, admin};
use baton_store::Store;
use reqwest::{Method, StatusCode};
use secrecy::SecretString;
use serde_json::Value;
use tokio::sync::oneshot;

/// Known to tests so they can sign their own (expired, forged) tokens.
pub const TEST_JWT_SECRET: &str = "test-secret-test-secret-test-secret-0123456789";
pub const LOGIN_ATTEMPTS_PER_MINUTE: u32 = 5;

/// A database of the test's own, removed when the test ends.
pub enum TestDatabase {
    Sqlite {
        _dir: tempfile::TempDir,
        path: PathBuf,
    },
    Postgres {
        admin_url: String,
        name: String,
        url: String,
    },
}

impl TestDatabase {
    pub async fn new() -> TestDatabase {
        match std::env::var("BATON_TEST_DATABASE_URL") {
            Ok(admin_url) if admin_url.starts_with("postgres") => {
                let name = format!("baton_t_{}", uuid::Uuid::now_v7().simple());
                let url = baton_store::provision::create_postgres_database(&admin_url, &name)
                    .await
                    .expect("create test database");
                TestDatabase::Postgres {
                    admin_url,
                    name,
                    url,
                }
            }
            _ => {
                let dir = tempfile::tempdir().expect("temp dir");
                let path = dir.path().join("baton.db");
                TestDatabase::Sqlite { _dir: dir, path }
            }
        }
    }

    pub fn url(&self) -> String {
        match self {
            TestDatabase::Sqlite { path, .. } => format!("sqlite://{}", path.display()),
            TestDatabase::Postgres { url, .. } => url.clone(),
        }
    }
}

impl TestDatabase {
    /// Everything stored, as text: the SQLite files' bytes, or `pg_dump`'s output.
    pub fn dump(&self) -> String {
        match self {
            TestDatabase::Sqlite { path, .. } => {
                let mut all = Vec::new();
                for suffix in ["", "-wal"] {
                    let file = PathBuf::from(format!("{}{suffix}", path.display()));
                    all.extend(std::fs::read(&file).unwrap_or_default());
                }
                String::from_utf8_lossy(&all).into_owned()
            }
            TestDatabase::Postgres { url, .. } => {
                let output = std::process::Command::new("pg_dump")
                    .arg(url)
                    .output()
                    .expect("pg_dump runs");
                assert!(
                    output.status.success(),
                    "pg_dump failed: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
                String::from_utf8_lossy(&output.stdout).into_owned()
            }
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if let TestDatabase::Postgres {
            admin_url, name, ..
        } = self
        {
            let (admin_url, name) = (admin_url.clone(), name.clone());
            // Drop runs outside any runtime guarantee; a short-lived thread does the async work.
            let _ = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                if let Ok(runtime) = runtime {
                    let _ = runtime.block_on(baton_store::provision::drop_postgres_database(
                        &admin_url, &name,
                    ));
                }
            })
            .join();
        }
    }
}

/// One tenant's credentials.
#[derive(Debug, Clone)]
pub struct TestTenant {
    pub id: String,
    pub name: String,
    pub api_key: String,
}

pub struct Response {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
}

impl Response {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }

    /// Asserts the DESIGN.md error shape and returns the `error` object.
    pub fn error(&self, status: u16, code: &str) -> Value {
        assert_eq!(
            self.status.as_u16(),
            status,
            "unexpected status; body: {}",
            self.text
        );
        let body = self.json();
        let error = &body["error"];
        assert_eq!(error["code"], code, "unexpected code; body: {}", self.text);
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{}",
            self.text
        );
        assert!(error["type"].is_string(), "{}", self.text);
        assert!(error.get("param").is_some(), "{}", self.text);
        let request_id = self
            .headers
            .get("x-request-id")
            .expect("X-Request-Id")
            .to_str()
            .unwrap();
        assert_eq!(error["requestId"], request_id);
        error.clone()
    }
}

pub struct TestApp {
    pub address: String,
    pub client: reqwest::Client,
    pub store: Store,
    /// The `default` tenant made at start-up.
    pub default_tenant: TestTenant,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
    // Dropped last: the database outlives the server.
    pub db: TestDatabase,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(configure: impl FnOnce(&mut Config)) -> TestApp {
    // The subscriber goes in before any app runs: a callsite first hit while another thread
    // installs the global subscriber can keep tracing's "never" interest for good, and a
    // debug run's kept lines (`llm_logs.rs`) would then miss it.
    let _ = captured_log();
    let db = TestDatabase::new().await;
    let mut config = Config::for_database(&db.url()).expect("config");
    config.bind = "127.0.0.1:0".parse().unwrap();
    let bootstrap_key = format!("baton_test_{}", uuid::Uuid::now_v7().simple());
    config.bootstrap_api_key = Some(SecretString::from(bootstrap_key.clone()));
    config.auth.jwt_secret = Some(SecretString::from(TEST_JWT_SECRET));
    config.auth.login_attempts_per_minute = LOGIN_ATTEMPTS_PER_MINUTE;
    config.database.max_connections = 5;
    // Debug builds on a shared two-core runner: tests that fire many requests at once would
    // see scheduling delays no release server has, and shed. `overload.rs` turns it on.
    config.server.shed_queue_delay_ms = 0;
    configure(&mut config);

    let app = Application::build(&config).await.expect("build app");
    let bootstrap = app.bootstrap().cloned().expect("empty database bootstraps");
    let address = format!("http://127.0.0.1:{}", app.port());
    let store = app.store().clone();
    let (tx, rx) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        app.run_until(async move {
            let _ = rx.await;
        })
        .await
        .expect("server");
    });
    TestApp {
        address,
        client: reqwest::Client::new(),
        store,
        default_tenant: TestTenant {
            id: bootstrap.tenant_id,
            name: bootstrap.tenant_name,
            api_key: bootstrap_key,
        },
        shutdown: Some(tx),
        server: Some(server),
        db,
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub async fn create_tenant(&self, name: &str) -> TestTenant {
        let (tenant, api_key) = admin::create_tenant(&self.store, name)
            .await
            .expect("create tenant");
        TestTenant {
            id: tenant.id.to_string(),
            name: tenant.name,
            api_key,
        }
    }

    /// Creates a user in `tenant` and logs in; returns the session token.
    pub async fn session_for(&self, tenant: &TestTenant) -> String {
        let email = format!(
            "user-{}@{}.example.com",
            uuid::Uuid::now_v7().simple(),
            tenant.name
        );
        admin::create_user(&self.store, &tenant.name, &email, "correct horse battery")
            .await
            .expect("create user");
        let response = self
            .request(
                Method::POST,
                "/api/v1/auth/login",
                None,
                Some(serde_json::json!({"email": email, "password": "correct horse battery"})),
            )
            .await;
        assert_eq!(response.status, 200, "{}", response.text);
        response.json()["accessToken"].as_str().unwrap().to_string()
    }

    pub async fn request(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Response {
        let mut builder = self.client.request(method, self.url(path));
        if let Some(token) = token {
            builder = builder.bearer_auth(token);
        }
        if let Some(body) = body {
            builder = builder.json(&body);
        }
        send(builder).await
    }

    pub async fn get(&self, path: &str, token: &str) -> Response {
        self.request(Method::GET, path, Some(token), None).await
    }

    pub async fn post(&self, path: &str, token: &str, body: Value) -> Response {
        self.request(Method::POST, path, Some(token), Some(body))
            .await
    }

    /// POSTs `body` to `path` and reads the SSE answer into its JSON `data:` payloads
    /// (`[DONE]` left out).
    pub async fn post_events(&self, path: &str, token: &str, body: Value) -> Vec<Value> {
        let response = self.post(path, token, body).await;
        assert_eq!(response.status, 200, "{}", response.text);
        response
            .text
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter(|data| *data != "[DONE]")
            .map(|data| serde_json::from_str(data).unwrap())
            .collect()
    }

    pub async fn put(&self, path: &str, token: &str, body: Value) -> Response {
        self.request(Method::PUT, path, Some(token), Some(body))
            .await
    }

    pub async fn delete(&self, path: &str, token: &str) -> Response {
        self.request(Method::DELETE, path, Some(token), None).await
    }

    /// Stops the server and waits until it has drained.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.expect("server task");
        }
    }

    /// [`TestApp::stop`] (which flushes the log writer), keeping the database to inspect.
    pub async fn stop_keeping_database(mut self) -> TestDatabase {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.expect("server task");
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let placeholder = TestDatabase::Sqlite {
            path: dir.path().join("unused.db"),
            _dir: dir,
        };
        std::mem::replace(&mut self.db, placeholder)
    }
}

/// Another server process over the same database (caches, writer and router of its own).
pub struct OtherInstance {
    pub address: String,
    _shutdown: oneshot::Sender<()>,
}

impl TestApp {
    pub async fn other_instance(&self) -> OtherInstance {
        let mut config = Config::for_database(&self.db.url()).expect("config");
        config.bind = "127.0.0.1:0".parse().unwrap();
        config.auth.jwt_secret = Some(SecretString::from(TEST_JWT_SECRET));
        config.database.max_connections = 5;
        config.server.shed_queue_delay_ms = 0;
        let app = Application::build(&config).await.expect("build app");
        let address = format!("http://127.0.0.1:{}", app.port());
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = app
                .run_until(async move {
                    let _ = rx.await;
                })
                .await;
        });
        OtherInstance {
            address,
            _shutdown: tx,
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

pub async fn send(builder: reqwest::RequestBuilder) -> Response {
    let response = builder.send().await.expect("request sent");
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.expect("body");
    Response {
        status,
        headers,
        text,
    }
}

/// Routes of the OpenAPI document: (method, path template, needs auth).
pub fn routes(doc: &Value) -> Vec<(Method, String, bool)> {
    let global_security = doc["security"].as_array().is_some_and(|s| !s.is_empty());
    let mut routes = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().unwrap() {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let needs_auth = match operation.get("security").and_then(Value::as_array) {
                // `security: [{}]` marks a public route.
                Some(list) => list
                    .iter()
                    .any(|req| req.as_object().is_some_and(|o| !o.is_empty())),
                None => global_security,
            };
            routes.push((method, path.clone(), needs_auth));
        }
    }
    routes
}

pub async fn openapi_doc(app: &TestApp) -> Value {
    let response = app
        .request(Method::GET, "/api/v1/openapi.json", None, None)
        .await;
    assert_eq!(response.status, 200);
    response.json()
}

/// Everything the server logged in this test process (debug and up for Baton's crates), with
/// the debug capture layer (`x_log_level`) installed beside it. One subscriber for the whole
/// binary, installed by the first app started.
pub fn captured_log() -> std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    static LOG: std::sync::OnceLock<std::sync::Arc<std::sync::Mutex<Vec<u8>>>> =
        std::sync::OnceLock::new();
    let log = LOG.get_or_init(|| {
        let buffer = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let writer = buffer.clone();
        let fmt = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || LogWriter(writer.clone()))
            .with_filter(tracing_subscriber::EnvFilter::new(
                "info,baton_api=trace,baton_executor=trace,baton_providers=trace,baton_tools=trace,baton_store=debug,baton_server=trace,tower_http=trace,rmcp=debug",
            ));
        let capture = baton_api::capture::CaptureLayer;
        let _ = tracing_subscriber::registry()
            .with(fmt)
            .with(capture.with_filter(baton_api::capture::CaptureLayer::filter()))
            .try_init();
        buffer
    })
    .clone();
    // A callsite first hit by another test thread while the subscriber was being installed
    // can keep tracing-core's cached "never" interest (tokio-rs/tracing#3401) and so miss this
    // log for the whole run; re-deciding every callsite's interest now, with the subscriber in
    // place, corrects that before the caller's requests are served.
    tracing::callsite::rebuild_interest_cache();
    log
}

struct LogWriter(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
