//! A client no one here wrote: the official OpenAI Python SDK against `/chat/completions`,
//! unchanged but for base URL and key. The test installs it into a venv under the target dir.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use baton_testkit::Reply;
use serde_json::{Value, json};

use crate::chat::app_with_mock;

const OPENAI_SDK: &str = "openai==3.54.0";

static VENV_LOCK: Mutex<()> = Mutex::new(());

/// A Python with the OpenAI SDK, made once per target dir (`BATON_TEST_PYTHON` overrides).
fn python_with_sdk() -> PathBuf {
    if let Some(python) = std::env::var_os("BATON_TEST_PYTHON") {
        return PathBuf::from(python);
    }
    python_with(OPENAI_SDK, "py-openai-sdk")
}

/// A venv under the target dir with `requirement` installed from PyPI, made once.
pub fn python_with(requirement: &str, venv_name: &str) -> PathBuf {
    let _guard = VENV_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(venv_name);
    let python = venv.join("bin/python");
    let marker = venv.join(format!(".installed-{requirement}"));
    if !marker.exists() {
        let status = Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv)
            .status()
            .expect("python3 -m venv");
        assert!(status.success(), "could not create a venv");
        let status = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                requirement,
            ])
            .status()
            .expect("pip install");
        assert!(
            status.success(),
            "could not install {requirement} from PyPI"
        );
        std::fs::write(&marker, "").unwrap();
    }
    python
}

#[tokio::test]
async fn the_official_openai_sdk_works_unchanged() {
    let python = tokio::task::spawn_blocking(python_with_sdk).await.unwrap();
    let (app, mock) = app_with_mock().await;
    mock.push(Reply::text("Hello from the mock").with_usage(11, 7));
    mock.push(Reply::text("Streamed ✓ text, in many small pieces").with_usage(21, 13));
    mock.push(Reply::tool_call("get_weather", json!({"city": "Paris"})));
    mock.push(Reply::text(r#"{"city": "Lyon"}"#));

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/openai_sdk.py");
    let base_url = app.url("/api/v1");
    let key = app.default_tenant.api_key.clone();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .env("BATON_BASE_URL", base_url)
            .env("BATON_API_KEY", key)
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    assert!(
        output.status.success(),
        "the SDK script failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();

    assert_eq!(report["sync"]["text"], "Hello from the mock");
    assert_eq!(report["sync"]["finish_reason"], "stop");
    assert_eq!(
        (
            report["sync"]["prompt_tokens"].as_u64(),
            report["sync"]["completion_tokens"].as_u64()
        ),
        (Some(11), Some(7))
    );
    assert_eq!(
        report["stream"]["text"],
        "Streamed ✓ text, in many small pieces"
    );
    assert_eq!(
        report["stream"]["usage"],
        json!({"prompt_tokens": 21, "completion_tokens": 13})
    );
    assert_eq!(
        report["tools"],
        json!({"name": "get_weather", "arguments": {"city": "Paris"}, "finish_reason": "tool_calls"})
    );
    assert_eq!(report["json_schema"], json!({"city": "Lyon"}));
    assert_eq!(
        report["errors"]["unknown_model"],
        json!({"status": 404, "code": "MODEL_NOT_FOUND", "class": "NotFoundError"})
    );
    assert_eq!(
        report["errors"]["bad_temperature"],
        json!({"status": 400, "code": "VALIDATION_ERROR", "class": "BadRequestError"})
    );
    // `models.list()` works and names models as requests do.
    assert_eq!(report["models"]["has_mini"], true, "{report}");

    // What the providers received: the OpenAI format for openai/, Anthropic's for anthropic/.
    let received = mock.received();
    assert_eq!(received[0].body["temperature"], 0.3);
    assert_eq!(received[1].path, "/v1/messages");
    assert_eq!(
        received[3].body["response_format"]["json_schema"]["name"],
        "city"
    );
}
