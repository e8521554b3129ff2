//! Extractors whose rejections are [`ApiError`]s naming the offending field.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::header;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::DEFAULT_MAX_BODY_BYTES;

/// The largest request body (`server.max_body_bytes`), for the extractors here, which read
/// bodies themselves; axum's own extractors take it from `DefaultBodyLimit`.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// Past the limit, how much more of a body is read and dropped, and for how long, before the
/// 413 is sent. Closing a socket with unread data resets the connection, and a client still
/// writing its body then sees a broken pipe instead of the answer (nginx's "lingering close").
const DRAIN_MAX_BYTES: usize = 8 * 1024 * 1024;
const DRAIN_MAX_TIME: Duration = Duration::from_secs(2);

/// A JSON body. Syntax errors are `INVALID_JSON`; type errors, unknown and missing fields are
/// `VALIDATION_ERROR` with `param` set to the field's path (`messages[2].role`).
pub struct Json<T>(pub T);

impl<T, S> FromRequest<S> for Json<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(req.headers()) {
            return Err(ApiError::Invalid {
                code: "INVALID_CONTENT_TYPE",
                message: "send the body as JSON with Content-Type: application/json".into(),
                param: None,
            });
        }
        let limit = body_limit(&req);
        let bytes = read_body(req.into_body(), limit).await?;
        // Every body of this API is a JSON object, but serde also reads a struct from an array
        // (`[null, null]` was a patch that changed nothing): refuse it as the document does.
        if is_array(&bytes) {
            return Err(ApiError::Invalid {
                code: "VALIDATION_ERROR",
                message: "the body must be a JSON object".into(),
                param: None,
            });
        }
        parse_json(&bytes).map(Json)
    }
}

/// The body of an operation that takes none: nothing, `{}` or `null`. Anything else is refused
/// (a field is named as an unknown one) rather than ignored, so a client that thinks it is
/// passing options learns it is not, and nothing is written.
pub struct NoBody;

impl<S> FromRequest<S> for NoBody
where
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct NoFields {}

        let limit = body_limit(&req);
        let has_json_type = is_json(req.headers());
        let bytes = read_body(req.into_body(), limit).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(NoBody);
        }
        if !has_json_type {
            return Err(ApiError::Invalid {
                code: "INVALID_CONTENT_TYPE",
                message: "this operation takes no body; send none, or {} as application/json"
                    .into(),
                param: None,
            });
        }
        // serde reads a field-less struct from `[]` too: only an object (or null) is "none".
        if is_array(&bytes) {
            return Err(ApiError::Invalid {
                code: "VALIDATION_ERROR",
                message: "this operation takes no body; send none, {} or null".into(),
                param: None,
            });
        }
        parse_json::<Option<NoFields>>(&bytes).map(|_| NoBody)
    }
}

/// Every router gets the limit from `with_request_layers`; the default is a backstop.
fn body_limit(req: &Request) -> usize {
    req.extensions()
        .get::<BodyLimit>()
        .map_or(DEFAULT_MAX_BODY_BYTES, |limit| limit.0)
}

/// Whether the body is a JSON array, which serde also reads a struct from.
fn is_array(bytes: &[u8]) -> bool {
    bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[')
}

/// `application/json` or another `application/*+json` type.
fn is_json(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let mime = v.split(';').next().unwrap_or("").trim();
            mime == "application/json"
                || (mime.starts_with("application/") && mime.ends_with("+json"))
        })
}

/// The whole body, at most `limit` bytes; past it, the rest is drained (bounded) and the answer
/// is 413. A body in one piece, the usual case, is not copied.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    use futures::StreamExt;
    let unreadable = |error: axum::Error| ApiError::Invalid {
        code: "INVALID_BODY",
        message: format!("the request body could not be read: {error}"),
        param: None,
    };
    let mut stream = body.into_data_stream();
    let mut first: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    let mut length = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(unreadable)?;
        length += chunk.len();
        if length > limit {
            drain(stream).await;
            return Err(ApiError::from_status(StatusCode::PAYLOAD_TOO_LARGE));
        }
        if first.is_none() && joined.is_empty() {
            first = Some(chunk);
            continue;
        }
        if let Some(earlier) = first.take() {
            joined.extend_from_slice(&earlier);
        }
        joined.extend_from_slice(&chunk);
    }
    Ok(first.unwrap_or_else(|| Bytes::from(joined)))
}

/// Reads and drops what is left of a refused body, up to [`DRAIN_MAX_BYTES`] and
/// [`DRAIN_MAX_TIME`], so the client can finish writing and read the answer.
async fn drain(mut stream: axum::body::BodyDataStream) {
    use futures::StreamExt;
    let _ = tokio::time::timeout(DRAIN_MAX_TIME, async {
        let mut drained = 0usize;
        while let Some(Ok(chunk)) = stream.next().await {
            drained += chunk.len();
            if drained > DRAIN_MAX_BYTES {
                break;
            }
        }
    })
    .await;
}

/// Deserialises `bytes`, naming the field at fault in the error.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        json_error(&path, &inner)
    })?;
    deserializer.end().map_err(|err| json_error(".", &err))?;
    Ok(value)
}

fn json_error(path: &str, err: &serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    match err.classify() {
        Category::Syntax | Category::Eof | Category::Io => ApiError::Invalid {
            code: "INVALID_JSON",
            message: format!("the body is not valid JSON: {err}"),
            param: None,
        },
        Category::Data => {
            let message = strip_position(&err.to_string());
            let param = param_of(path, &message);
            ApiError::Invalid {
                code: "VALIDATION_ERROR",
                message,
                param,
            }
        }
    }
}

fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(at) => message[..at].to_string(),
        None => message.to_string(),
    }
}

/// The field a data error names: its path, and for a missing field the field itself (serde
/// reports it on its parent, as ``missing field `name` ``; unknown fields already end the path).
/// A body of the wrong type altogether (`5`, `true`) names no field.
fn param_of(path: &str, message: &str) -> Option<String> {
    let root = path == "." || path.is_empty();
    // serde names a missing or repeated field in its message, the path stopping at its parent.
    let named = ["missing field `", "duplicate field `"]
        .iter()
        .find_map(|prefix| message.strip_prefix(prefix))
        .and_then(|rest| rest.split_once('`'))
        .map(|(field, _)| field);
    match named {
        Some(field) if root => Some(field.to_string()),
        Some(field) => Some(format!("{path}.{field}")),
        None if root => None,
        None => Some(path.to_string()),
    }
}

/// Query-string parameters, with the same error reporting as [`Json`].
pub struct Query<T>(pub T);

impl<T, S> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        let deserializer =
            serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(deserializer)
            .map(Query)
            .map_err(|err| {
                let path = err.path().to_string();
                let message = err.into_inner().to_string();
                let param = param_of(&path, &message);
                ApiError::Invalid {
                    code: "VALIDATION_ERROR",
                    message: format!("invalid query: {message}"),
                    param,
                }
            })
    }
}

/// One path parameter; axum already percent-decodes it.
pub struct PathParam(pub String);

/// Several path segments (`(flowId, versionId)`), rejected in the error shape.
pub struct PathParams<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| PathParams(value))
            .map_err(|rejection| ApiError::Invalid {
                code: "VALIDATION_ERROR",
                message: rejection.body_text(),
                param: None,
            })
    }
}

impl<S: Send + Sync> FromRequestParts<S> for PathParam {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| PathParam(value))
            .map_err(|rejection| ApiError::Invalid {
                code: "VALIDATION_ERROR",
                message: rejection.body_text(),
                param: None,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        external_id: String,
        items: Option<Vec<Item>>,
        strategy: Option<Strategy>,
    }

    #[derive(Debug, Deserialize)]
    enum Strategy {
        Sequential,
        RoundRobin,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Item {
        n: u32,
    }

    fn param_and_code(json: &str) -> (Option<String>, &'static str) {
        match parse_json::<Body>(json.as_bytes()).unwrap_err() {
            ApiError::Invalid { param, code, .. } => (param, code),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(param_and_code("{"), (None, "INVALID_JSON"));
        assert_eq!(
            param_and_code(r#"{"externalId": "x"} trailing"#),
            (None, "INVALID_JSON")
        );
        assert_eq!(
            param_and_code("{}"),
            (Some("externalId".into()), "VALIDATION_ERROR")
        );
        assert_eq!(
            param_and_code(r#"{"externalId": 5}"#),
            (Some("externalId".into()), "VALIDATION_ERROR")
        );
        assert_eq!(
            param_and_code(r#"{"externalId": "x", "zzz": 1}"#),
            (Some("zzz".into()), "VALIDATION_ERROR")
        );
        assert_eq!(
            param_and_code(r#"{"externalId": "x", "externalId": "y"}"#),
            (Some("externalId".into()), "VALIDATION_ERROR")
        );
        assert_eq!(
            param_and_code(r#"{"externalId": "x", "items": [{"n": 1, "n": 2}]}"#),
            (Some("items[0].n".into()), "VALIDATION_ERROR")
        );
        assert_eq!(
            param_and_code(r#"{"externalId": "x", "items": [{"n": 1}, {"n": "two"}]}"#),
            (Some("items[1].n".into()), "VALIDATION_ERROR")
        );
        assert_eq!(
            param_and_code(r#"{"externalId": "x", "strategy": "Random"}"#),
            (Some("strategy".into()), "VALIDATION_ERROR")
        );
        assert_eq!(
            param_and_code(r#"{"externalId": "x", "items": [{"n": 1}, {}]}"#),
            (Some("items[1].n".into()), "VALIDATION_ERROR"),
            "a missing nested field is named, not its parent"
        );
        for not_an_object in ["5", "true", r#""text""#, "[]"] {
            assert_eq!(
                param_and_code(not_an_object),
                (None, "VALIDATION_ERROR"),
                "{not_an_object}: the body as a whole is wrong"
            );
        }
    }
}
