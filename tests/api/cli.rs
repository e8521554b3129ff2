//! The `baton` binary as an operator uses it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::helpers::{TestDatabase, send};

fn baton(db: &TestDatabase) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_baton"));
    command
        .env("BATON_DATABASE_URL", db.url())
        .env("BATON_LOG", "warn")
        .env_remove("BATON_BOOTSTRAP_API_KEY");
    command
}

fn run_ok(command: &mut Command) -> String {
    let output = command.output().expect("run baton");
    assert!(
        output.status.success(),
        "baton failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn serve_bootstraps_then_admin_commands_work_against_it() {
    let db = TestDatabase::new().await;
    let port = free_port();
    let mut server = baton(&db)
        .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start baton serve");

    // The first start prints the default tenant's key once.
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let mut key = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(found) = line.split_whitespace().find(|w| w.starts_with("baton_")) {
            key = Some(found.to_string());
            break;
        }
    }
    let key = key.expect("the bootstrap key was printed");
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let mut ready = false;
    for _ in 0..100 {
        if client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "baton serve never became ready");
    let envs = send(
        client
            .get(format!("{base}/api/v1/environments"))
            .bearer_auth(&key),
    )
    .await;
    assert_eq!(envs.status, 200, "{}", envs.text);

    // tenant create --json, key create, user create, all against the running server's database.
    let created: serde_json::Value = serde_json::from_str(&run_ok(
        baton(&db).args(["tenant", "create", "--name", "acme", "--json"]),
    ))
    .unwrap();
    assert_eq!(created["name"], "acme");
    assert!(created["tenantId"].is_string());
    let acme_key = created["apiKey"].as_str().unwrap().to_string();
    let second = run_ok(baton(&db).args(["key", "create", "--tenant", "acme"]));
    let second_key = second
        .split_whitespace()
        .find(|w| w.starts_with("baton_"))
        .unwrap()
        .to_string();
    run_ok(baton(&db).args([
        "user",
        "create",
        "--tenant",
        "acme",
        "--email",
        "Ops@Acme.example",
        "--password",
        "long password",
    ]));

    for k in [&acme_key, &second_key] {
        let response = send(
            client
                .post(format!("{base}/api/v1/environments"))
                .bearer_auth(k)
                .json(&json!({"name": format!("e-{}", &k[6..12])})),
        )
        .await;
        assert_eq!(response.status, 201, "{}", response.text);
    }
    let login = send(
        client
            .post(format!("{base}/api/v1/auth/login"))
            .json(&json!({"email": "ops@acme.example", "password": "long password"})),
    )
    .await;
    assert_eq!(login.status, 200, "{}", login.text);
    assert_eq!(login.json()["tokenType"], "Bearer");

    // The default tenant does not see acme's environments.
    let default_envs = send(
        client
            .get(format!("{base}/api/v1/environments"))
            .bearer_auth(&key),
    )
    .await;
    assert_eq!(default_envs.json(), json!([]));

    // Errors are reported, not panicked.
    let output = baton(&db)
        .args(["key", "create", "--tenant", "nope"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("tenant 'nope' not found"));

    // SIGTERM: graceful shutdown, exit status 0.
    let status = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "baton serve exited with {exit}");

    // A second start finds the tenant and prints no key.
    let mut again = baton(&db)
        .args(["serve", "--bind", &format!("127.0.0.1:{}", free_port())])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Command::new("kill")
        .args(["-TERM", &again.id().to_string()])
        .status()
        .unwrap();
    let output = tokio::task::spawn_blocking(move || {
        again.wait().unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut again.stdout.take().unwrap(), &mut out).unwrap();
        out
    })
    .await
    .unwrap();
    assert!(
        !output.contains("baton_"),
        "a key was printed again: {output}"
    );
}

#[test]
fn migrate_and_bad_config_exit_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let output = Command::new(env!("CARGO_BIN_EXE_baton"))
        .arg("migrate")
        .env("BATON_DATABASE_URL", &url)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let output = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["migrate", "--config", "/nonexistent/baton.toml"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("does not exist"));

    let output = Command::new(env!("CARGO_BIN_EXE_baton"))
        .arg("migrate")
        .env("BATON_DATABASE_URL", "mysql://x")
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("unsupported database URL"));
}

/// Provider keys and the tenant's own key never reach the log, even at debug level, through
/// successes, provider errors, broken streams and routing fallbacks.
#[tokio::test]
async fn no_secret_reaches_the_log_output() {
    const OPENAI_CANARY: &str = "sk-log-canary-openai-8c1d";
    const ANTHROPIC_CANARY: &str = "sk-ant-log-canary-2f9e";
    let mock = baton_testkit::MockProvider::start().await.unwrap();
    let db = TestDatabase::new().await;
    let port = free_port();
    let tenant_key = format!("baton_logcanary{}", uuid::Uuid::now_v7().simple());
    let mut server = baton(&db)
        .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
        .env("BATON_LOG", "debug")
        .env("BATON_LOG_FORMAT", "json")
        .env("BATON_BOOTSTRAP_API_KEY", &tenant_key)
        .env("BATON_PROVIDERS__OPENAI__BASE_URL", mock.openai_base())
        .env("BATON_PROVIDERS__OPENAI__API_KEY", OPENAI_CANARY)
        .env("BATON_PROVIDERS__ANTHROPIC__BASE_URL", mock.root())
        .env("BATON_PROVIDERS__ANTHROPIC__API_KEY", ANTHROPIC_CANARY)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start baton serve");
    let stderr = server.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut out).unwrap();
        out
    });

    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        if client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let chat = |body: serde_json::Value| {
        send(
            client
                .post(format!("{base}/api/v1/chat/completions"))
                .bearer_auth(&tenant_key)
                .json(&body),
        )
    };
    let rule = send(
        client
            .post(format!("{base}/api/v1/routing-rules"))
            .bearer_auth(&tenant_key)
            .json(&json!({"alias": "chain", "models": ["openai/gpt-4o-mini", "anthropic/claude-haiku-4-5"]})),
    )
    .await;
    assert_eq!(rule.status, 201, "{}", rule.text);
    let messages = json!([{"role": "user", "content": "hi"}]);
    use baton_testkit::Reply;
    mock.push(Reply::text("fine"));
    assert_eq!(
        chat(json!({"model": "openai/gpt-4o-mini", "messages": messages}))
            .await
            .status,
        200
    );
    mock.push(Reply::status(401, "invalid api key"));
    chat(json!({"model": "anthropic/claude-haiku-4-5", "messages": messages})).await;
    mock.push(Reply::status(500, "boom"));
    mock.push(Reply::text("fallback"));
    assert_eq!(
        chat(json!({"model": "chain", "messages": messages}))
            .await
            .status,
        200
    );
    mock.push(Reply::BreakAfterFirstChunk(Box::new(Reply::text(
        "a stream that breaks",
    ))));
    chat(json!({"model": "openai/gpt-4o-mini", "messages": messages, "stream": true})).await;
    chat(json!({"model": "nope/x", "messages": messages})).await;
    // A wrong key is logged as a failure without the key.
    send(
        client
            .get(format!("{base}/api/v1/environments"))
            .bearer_auth(format!("{tenant_key}x")),
    )
    .await;

    Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap()
        .unwrap();
    let output = log.join().unwrap();
    assert!(
        output.lines().count() > 10,
        "expected debug logs, got: {output}"
    );
    assert!(output.contains("chat/completions"), "requests are logged");
    for secret in [OPENAI_CANARY, ANTHROPIC_CANARY, tenant_key.as_str()] {
        assert!(
            !output.contains(secret),
            "{secret} appears in the log output"
        );
    }
}

/// A malformed bootstrap key is refused before the database is touched: no database file is
/// left behind by a start that failed.
#[tokio::test]
async fn a_malformed_bootstrap_key_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("baton.db");
    let output = Command::new(env!("CARGO_BIN_EXE_baton"))
        .current_dir(dir.path())
        .env("BATON_DATABASE_URL", format!("sqlite://{}", path.display()))
        .env("BATON_LOG", "warn")
        .env("BATON_BOOTSTRAP_API_KEY", "bk_too_short")
        .args(["serve", "--bind", &format!("127.0.0.1:{}", free_port())])
        .output()
        .expect("run baton");
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("BATON_BOOTSTRAP_API_KEY must start with"),
        "{said}"
    );
    assert!(!path.exists(), "no database was created");

    // Nor is a key that could never travel in a bearer token, or a pool of no connections.
    for (variable, value, said_what) in [
        (
            "BATON_BOOTSTRAP_API_KEY",
            "baton_0123456789abcdef0123456789abcd ef",
            "without spaces",
        ),
        (
            "BATON_DATABASE__MAX_CONNECTIONS",
            "0",
            "database.max_connections",
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_baton"))
            .current_dir(dir.path())
            .env("BATON_DATABASE_URL", format!("sqlite://{}", path.display()))
            .env("BATON_LOG", "warn")
            .env(variable, value)
            .args(["serve", "--bind", &format!("127.0.0.1:{}", free_port())])
            .output()
            .expect("run baton");
        let said = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{said}");
        assert!(said.contains(said_what), "{said}");
        assert!(!path.exists(), "no database was created");
    }
}
