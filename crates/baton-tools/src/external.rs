//! External (HTTP) tool calls (SPEC.md "Tool", "Caller-hosted tools"): choosing the endpoint of
//! one call, then a guarded GET with the model's arguments as query parameters.
//!
//! # Endpoint selection ([`select_endpoint`])
//!
//! 1. The URL template is `environmentOverrides[env].webUrl`, else `webUrls[env]`, else `webUrl`
//!    (`env` being the run's environment). The origin source is `environment` for the first two
//!    and `tool` for the last.
//! 2. `[[name]]` placeholders are replaced by the flow run's request parameters, percent-encoded
//!    (everything but `A-Z a-z 0-9 - . _ ~`), so a value can neither end a path segment nor add
//!    a query parameter nor change the host. A placeholder without a value fails the binding,
//!    naming the parameter.
//! 3. A relative template (starting with `/`) is caller-hosted: source `callback`. Without a
//!    callback URL on the request the binding fails, naming that cause; no stored URL is
//!    substituted. Otherwise the URL is the callback URL's origin (scheme, host, port; its own
//!    path and query are ignored) with the template's path and query.
//! 4. An absolute `webUrl` (source `tool`) on a request that sent a callback URL keeps its path
//!    and query but takes the callback origin's scheme, host and port (the legacy behaviour of
//!    the debug header): source `callback`, without the tool's stored headers (they are the
//!    stored host's credentials, not the caller's). An environment-pinned URL (source
//!    `environment`) is never redirected: pinning is how a tenant fixes a real host for an
//!    environment.
//! 5. Whenever the source is `callback`, the origin must match one of the tenant's registered
//!    callback origins. With none registered the binding fails (caller-hosted tools do not run);
//!    an origin that matches none fails naming the origin. The outbound guard (private and
//!    reserved addresses) still applies when the request is sent, whatever the allowlist says.
//! 6. The callback token is sent only on `callback` calls, never to a stored host.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use baton_domain::origin::CallbackOrigin;
use baton_domain::tool::{Tool, is_relative_url};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use url::Url;

use crate::error::ToolError;
use crate::guard::{GuardedClient, read_capped, redact};

/// Everything but the unreserved characters of RFC 3986 is encoded in substituted values.
const VALUE_ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Characters of a non-2xx body quoted in the error (the model and the log see it).
const ERROR_BODY_CHARS: usize = 200;
/// Bytes read from a non-2xx body: enough for `ERROR_BODY_CHARS` characters of UTF-8.
const ERROR_BODY_BYTES: usize = ERROR_BODY_CHARS * 4;

/// Where a call's endpoint came from (SPEC.md "Caller-hosted tools"); serialised lowercase:
/// `tool`, `environment`, `callback`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OriginSource {
    /// The tool's stored absolute `webUrl`.
    Tool,
    /// The URL pinned for the run's environment (`environmentOverrides`, `webUrls`).
    Environment,
    /// The caller's origin from X-Baton-Callback-Url (or the deprecated X-Baton-Debug-Url).
    Callback,
}

impl OriginSource {
    pub fn as_str(self) -> &'static str {
        match self {
            OriginSource::Tool => "tool",
            OriginSource::Environment => "environment",
            OriginSource::Callback => "callback",
        }
    }
}

/// What a run knows that a tool call needs.
#[derive(Debug, Clone, Copy)]
pub struct CallContext<'a> {
    /// The run's environment name.
    pub environment: Option<&'a str>,
    /// The flow run's request parameters, for `[[param]]` in URLs.
    pub parameters: &'a HashMap<String, String>,
    /// From X-Baton-Callback-Url (or the deprecated X-Baton-Debug-Url); only its origin counts.
    pub callback_url: Option<&'a Url>,
    /// X-Baton-Callback-Token: held for the run, never stored, never logged.
    pub callback_token: Option<&'a str>,
    /// The tenant's registered callback origins.
    pub callback_origins: &'a [CallbackOrigin],
}

/// The endpoint bound for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub url: Url,
    pub origin_source: OriginSource,
    /// Whether the tool's stored headers go with the call: not when a caller's callback URL
    /// moved an absolute `webUrl` to another origin. Stored headers usually hold the tool's
    /// credentials for the host it names, and any caller with a registered origin could
    /// otherwise collect them (a record edit that changes the host must resend them too).
    pub sends_stored_headers: bool,
}

/// Failure to bind a host: still carries what is known for the `toolFailed` event (origin
/// source, and the redacted target when one was computed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindError {
    pub origin_source: OriginSource,
    pub target_url: Option<String>,
    pub error: ToolError,
}

/// Chooses the endpoint of one call by the rules in this module's documentation.
pub fn select_endpoint(tool: &Tool, ctx: &CallContext<'_>) -> Result<Endpoint, BindError> {
    let config = &tool.config;
    let pinned = ctx.environment.and_then(|env| {
        config
            .environment_overrides
            .get(env)
            .map(|o| o.web_url.as_str())
            .or_else(|| config.web_urls.get(env).map(String::as_str))
    });
    let (template, stored_source) = match (pinned, config.web_url.as_deref()) {
        (Some(url), _) => (url, OriginSource::Environment),
        (None, Some(url)) => (url, OriginSource::Tool),
        (None, None) => {
            let message = match ctx.environment {
                Some(env) => format!(
                    "tool '{}' has no webUrl for environment '{env}' and no default webUrl",
                    tool.name
                ),
                None => format!("tool '{}' has no webUrl", tool.name),
            };
            return Err(BindError {
                origin_source: OriginSource::Tool,
                target_url: None,
                error: ToolError::Unbound(message),
            });
        }
    };
    let relative = is_relative_url(template);
    // Rules 3 and 4: the source is known before anything is substituted, so every failure
    // below reports it.
    let source = if relative || (stored_source == OriginSource::Tool && ctx.callback_url.is_some())
    {
        OriginSource::Callback
    } else {
        stored_source
    };
    let fail = |target_url: Option<String>, message: String| BindError {
        origin_source: source,
        target_url,
        error: ToolError::Unbound(message),
    };

    let filled = substitute(template, ctx.parameters)
        .map_err(|why| fail(None, format!("tool '{}': {why}", tool.name)))?;
    let parse_absolute = |text: &str| {
        Url::parse(text).map_err(|e| {
            fail(
                None,
                format!(
                    "tool '{}': webUrl is not a valid URL once filled in ({e})",
                    tool.name
                ),
            )
        })
    };

    if source != OriginSource::Callback {
        let url = parse_absolute(&filled)?;
        return Ok(Endpoint {
            url,
            origin_source: source,
            sends_stored_headers: true,
        });
    }

    let Some(callback) = ctx.callback_url else {
        // Only a relative template gets here without a callback URL (rule 3).
        return Err(fail(
            None,
            format!(
                "tool '{}' is caller-hosted (relative webUrl) and the request sent no X-Baton-Callback-Url header",
                tool.name
            ),
        ));
    };
    let mut url = callback_origin(callback).ok_or_else(|| {
        fail(
            None,
            "the X-Baton-Callback-Url header is not an http or https URL with a host".to_string(),
        )
    })?;
    // A relative webUrl is caller-hosted by design: its headers are meant for these hosts. An
    // absolute one keeps them only where the callback origin is its own.
    let mut sends_stored_headers = relative;
    if relative {
        // The fragment is never sent; the query, if any, follows the first '?'.
        let without_fragment = filled.split('#').next().unwrap_or_default();
        let (path, query) = match without_fragment.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (without_fragment, None),
        };
        // Setting the path on the origin (rather than joining text) keeps the host fixed even
        // for a path such as `//other.example/x`.
        url.set_path(path);
        url.set_query(query);
    } else {
        let stored = parse_absolute(&filled)?;
        url.set_path(stored.path());
        url.set_query(stored.query());
        sends_stored_headers = url.origin() == stored.origin();
    }

    let origin = url.origin().ascii_serialization();
    if ctx.callback_origins.is_empty() {
        return Err(fail(
            Some(redact(&url)),
            "no callback origins are registered for this tenant: caller-hosted tools do not run"
                .to_string(),
        ));
    }
    if !ctx.callback_origins.iter().any(|o| o.matches(&url)) {
        return Err(fail(
            Some(redact(&url)),
            format!(
                "the callback origin {origin} is not one of this tenant's registered callback origins"
            ),
        ));
    }
    Ok(Endpoint {
        url,
        origin_source: OriginSource::Callback,
        sends_stored_headers,
    })
}

/// The callback URL reduced to its origin (path `/`, no credentials, query or fragment).
fn callback_origin(callback: &Url) -> Option<Url> {
    if !matches!(callback.scheme(), "http" | "https") || callback.host().is_none() {
        return None;
    }
    let mut origin = callback.clone();
    origin.set_username("").ok()?;
    origin.set_password(None).ok()?;
    origin.set_path("/");
    origin.set_query(None);
    origin.set_fragment(None);
    Some(origin)
}

/// Replaces `[[name]]` placeholders with percent-encoded parameter values.
fn substitute(template: &str, parameters: &HashMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find("[[") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let Some(close) = after.find("]]") else {
            return Err(format!("webUrl has an unclosed '[[' in '{template}'"));
        };
        let name = &after[..close];
        if !is_parameter_name(name) {
            return Err(format!(
                "webUrl has an invalid placeholder '[[{name}]]' (names are lowercase letters, digits and '_')"
            ));
        }
        let Some(value) = parameters.get(name) else {
            return Err(format!(
                "webUrl needs the request parameter '{name}', which the run did not receive"
            ));
        };
        // Writing to a String cannot fail.
        let _ = write!(out, "{}", utf8_percent_encode(value, VALUE_ENCODE));
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `[a-z0-9_]+`, the template language's parameter names.
fn is_parameter_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// What one External call produced, with what the log and the events record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalOutcome {
    /// The endpoint used, without query, credentials or fragment; `None` when none was bound.
    pub target_url: Option<String>,
    pub origin_source: OriginSource,
    /// The response body (lossy UTF-8), or why the call failed.
    pub result: Result<String, ToolError>,
}

/// Binds the endpoint, then GETs it with the arguments as query parameters, the tool's stored
/// headers, and on `callback` calls the callback token under the tool's token header (replacing
/// a stored header of that name). The body is read up to `max_bytes`; a non-2xx status is an
/// error quoting the start of the body; the whole call is bounded by `timeout`.
pub async fn call_external(
    client: &GuardedClient,
    tool: &Tool,
    ctx: &CallContext<'_>,
    arguments: &serde_json::Map<String, Value>,
    timeout: Duration,
    max_bytes: usize,
) -> ExternalOutcome {
    let endpoint = match select_endpoint(tool, ctx) {
        Ok(endpoint) => endpoint,
        Err(bind) => {
            tracing::debug!(
                tool = %tool.name,
                origin_source = bind.origin_source.as_str(),
                error = %bind.error,
                "external tool not bound"
            );
            return ExternalOutcome {
                target_url: bind.target_url,
                origin_source: bind.origin_source,
                result: Err(bind.error),
            };
        }
    };
    let target_url = redact(&endpoint.url);
    // The target is redacted and the token is never logged.
    tracing::debug!(
        tool = %tool.name,
        target = %target_url,
        origin_source = endpoint.origin_source.as_str(),
        "external tool call"
    );
    let call = send(client, tool, ctx, &endpoint, arguments, max_bytes);
    let result = tokio::time::timeout(timeout, call)
        .await
        .unwrap_or(Err(ToolError::Timeout));
    ExternalOutcome {
        target_url: Some(target_url),
        origin_source: endpoint.origin_source,
        result,
    }
}

async fn send(
    client: &GuardedClient,
    tool: &Tool,
    ctx: &CallContext<'_>,
    endpoint: &Endpoint,
    arguments: &serde_json::Map<String, Value>,
    max_bytes: usize,
) -> Result<String, ToolError> {
    let mut url = endpoint.url.clone();
    let pairs = query_pairs(arguments);
    if !pairs.is_empty() {
        let mut query = url.query_pairs_mut();
        for (name, value) in &pairs {
            query.append_pair(name, value);
        }
    }
    let headers = headers(tool, ctx, endpoint)?;
    let request = client.request(reqwest::Method::GET, &url)?.headers(headers);
    let response = client.send(request).await?;
    let status = response.status();
    if !status.is_success() {
        let body = read_prefix(response, ERROR_BODY_BYTES).await;
        return Err(ToolError::Status {
            status: status.as_u16(),
            body: shorten(&body, ERROR_BODY_CHARS),
        });
    }
    let body = read_capped(response, max_bytes).await?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The arguments as query pairs: arrays repeat the name, strings go as they are, numbers and
/// booleans as their JSON text, objects as compact JSON; nulls (an optional argument left out)
/// are skipped.
fn query_pairs(arguments: &serde_json::Map<String, Value>) -> Vec<(String, String)> {
    let mut pairs = Vec::with_capacity(arguments.len());
    for (name, value) in arguments {
        match value {
            Value::Array(items) => pairs.extend(
                items
                    .iter()
                    .filter_map(query_text)
                    .map(|text| (name.clone(), text)),
            ),
            other => pairs.extend(query_text(other).map(|text| (name.clone(), text))),
        }
    }
    pairs
}

fn query_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(text) => Some(text.clone()),
        other => Some(other.to_string()),
    }
}

/// The stored headers (unless the endpoint withholds them), then the callback token on
/// `callback` calls. `HeaderMap` names are case-insensitive, so the token replaces a stored
/// header of the same name in any case.
fn headers(
    tool: &Tool,
    ctx: &CallContext<'_>,
    endpoint: &Endpoint,
) -> Result<HeaderMap, ToolError> {
    let mut headers = HeaderMap::new();
    let stored = endpoint
        .sends_stored_headers
        .then_some(&tool.config.headers)
        .into_iter()
        .flatten();
    for (name, value) in stored {
        // The value is never quoted: stored headers often hold credentials.
        let header_name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid_header(name, "not a valid header name"))?;
        let mut header_value = HeaderValue::from_str(value)
            .map_err(|_| invalid_header(name, "the stored value is not a valid header value"))?;
        header_value.set_sensitive(true);
        headers.insert(header_name, header_value);
    }
    if endpoint.origin_source == OriginSource::Callback
        && let Some(token) = ctx.callback_token
    {
        let name = tool.callback_token_header();
        let header_name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid_header(name, "not a valid header name (callbackTokenHeader)"))?;
        let mut header_value = HeaderValue::from_str(token).map_err(|_| {
            invalid_header(
                name,
                "the X-Baton-Callback-Token value is not a valid header value",
            )
        })?;
        header_value.set_sensitive(true);
        headers.insert(header_name, header_value);
    }
    Ok(headers)
}

fn invalid_header(name: &str, reason: &str) -> ToolError {
    ToolError::InvalidHeader {
        name: name.to_string(),
        reason: reason.to_string(),
    }
}

/// Up to `limit` bytes of a body, for an error message; a failure to read ends it early.
async fn read_prefix(mut response: reqwest::Response, limit: usize) -> String {
    let mut body = Vec::new();
    while body.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    body.truncate(limit);
    String::from_utf8_lossy(&body).into_owned()
}

/// At most `chars` characters of `text`, trimmed, with "..." when cut.
fn shorten(text: &str, chars: usize) -> String {
    let text = text.trim();
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use baton_domain::Timestamp;
    use baton_domain::tool::{EnvironmentOverride, ToolConfig, ToolParameters, ToolType};
    use serde_json::json;

    use super::*;

    fn tool(web_url: Option<&str>) -> Tool {
        Tool {
            id: "t1".into(),
            name: "weather".into(),
            description: None,
            tool_type: ToolType::External,
            type_alias: ToolType::External,
            parameters: ToolParameters::default(),
            config: ToolConfig {
                web_url: web_url.map(str::to_string),
                ..ToolConfig::default()
            },
            created_at: Timestamp::now(),
            updated_at: Timestamp::now(),
        }
    }

    fn pinned(web_url: Option<&str>) -> Tool {
        let mut tool = tool(web_url);
        tool.config.web_urls = BTreeMap::from([
            ("staging".into(), "https://staging.example.com/w".into()),
            ("prod".into(), "https://urls.example.com/w".into()),
        ]);
        tool.config.environment_overrides = BTreeMap::from([(
            "prod".into(),
            EnvironmentOverride {
                web_url: "https://override.example.com/w?q=1".into(),
            },
        )]);
        tool
    }

    fn origins(patterns: &[&str]) -> Vec<CallbackOrigin> {
        patterns
            .iter()
            .map(|p| CallbackOrigin::parse(p, "o").unwrap())
            .collect()
    }

    /// A context builder: environment, callback URL, registered origins.
    struct Ctx {
        environment: Option<&'static str>,
        parameters: HashMap<String, String>,
        callback: Option<Url>,
        origins: Vec<CallbackOrigin>,
    }

    impl Ctx {
        fn new() -> Ctx {
            Ctx {
                environment: None,
                parameters: HashMap::new(),
                callback: None,
                origins: Vec::new(),
            }
        }
        fn env(mut self, env: &'static str) -> Ctx {
            self.environment = Some(env);
            self
        }
        fn param(mut self, name: &str, value: &str) -> Ctx {
            self.parameters.insert(name.into(), value.into());
            self
        }
        fn callback(mut self, url: &str, patterns: &[&str]) -> Ctx {
            self.callback = Some(Url::parse(url).unwrap());
            self.origins = origins(patterns);
            self
        }
        fn select(&self, tool: &Tool) -> Result<Endpoint, BindError> {
            select_endpoint(
                tool,
                &CallContext {
                    environment: self.environment,
                    parameters: &self.parameters,
                    callback_url: self.callback.as_ref(),
                    callback_token: Some("secret-token"),
                    callback_origins: &self.origins,
                },
            )
        }
    }

    fn ok(result: Result<Endpoint, BindError>) -> (String, OriginSource) {
        let endpoint = result.unwrap();
        (endpoint.url.to_string(), endpoint.origin_source)
    }

    fn message(err: &BindError) -> String {
        match &err.error {
            ToolError::Unbound(message) => message.clone(),
            other => panic!("not a binding error: {other:?}"),
        }
    }

    #[test]
    fn a_stored_absolute_url_is_the_tool_source() {
        let got = ok(Ctx::new().select(&tool(Some("https://api.example.com/w?x=1"))));
        assert_eq!(
            got,
            ("https://api.example.com/w?x=1".into(), OriginSource::Tool)
        );
    }

    #[test]
    fn environment_override_beats_web_urls_beats_web_url() {
        let tool = pinned(Some("https://default.example.com/w"));
        assert_eq!(
            ok(Ctx::new().env("prod").select(&tool)),
            (
                "https://override.example.com/w?q=1".into(),
                OriginSource::Environment
            )
        );
        assert_eq!(
            ok(Ctx::new().env("staging").select(&tool)),
            (
                "https://staging.example.com/w".into(),
                OriginSource::Environment
            )
        );
        // An environment with neither falls back to webUrl.
        assert_eq!(
            ok(Ctx::new().env("dev").select(&tool)),
            ("https://default.example.com/w".into(), OriginSource::Tool)
        );
        assert_eq!(
            ok(Ctx::new().select(&tool)),
            ("https://default.example.com/w".into(), OriginSource::Tool)
        );
    }

    #[test]
    fn no_url_for_the_environment_and_no_default_fails() {
        let mut tool = tool(None);
        tool.config.web_urls = BTreeMap::from([("prod".into(), "https://p.example.com/".into())]);
        let err = Ctx::new().env("dev").select(&tool).unwrap_err();
        assert_eq!(err.origin_source, OriginSource::Tool);
        assert!(message(&err).contains("no webUrl for environment 'dev'"));
    }

    #[test]
    fn a_relative_url_joins_the_callback_origin() {
        let got = ok(Ctx::new()
            .callback(
                "https://app.example.com:8443/ignored/path?ignored=1#f",
                &["https://app.example.com:8443"],
            )
            .select(&tool(Some("/tools/weather?unit=c"))));
        assert_eq!(
            got,
            (
                "https://app.example.com:8443/tools/weather?unit=c".into(),
                OriginSource::Callback
            )
        );
    }

    #[test]
    fn a_protocol_relative_looking_path_stays_on_the_callback_host() {
        let got = ok(Ctx::new()
            .callback("https://app.example.com", &["app.example.com"])
            .select(&tool(Some("/\\evil.example.net/x"))));
        assert!(got.0.starts_with("https://app.example.com/"), "{}", got.0);
    }

    #[test]
    fn a_relative_url_without_a_callback_url_names_the_cause() {
        let err = Ctx::new().select(&tool(Some("/weather"))).unwrap_err();
        assert_eq!(err.origin_source, OriginSource::Callback);
        assert_eq!(err.target_url, None);
        assert_eq!(
            message(&err),
            "tool 'weather' is caller-hosted (relative webUrl) and the request sent no X-Baton-Callback-Url header"
        );
    }

    #[test]
    fn a_relative_default_can_be_pinned_to_a_host_per_environment() {
        let mut tool = tool(Some("/weather"));
        tool.config.environment_overrides = BTreeMap::from([(
            "prod".into(),
            EnvironmentOverride {
                web_url: "https://weather.example.com/v1".into(),
            },
        )]);
        // Pinned: the callback URL neither is needed nor redirects it.
        assert_eq!(
            ok(Ctx::new()
                .env("prod")
                .callback("https://app.example.com", &["app.example.com"])
                .select(&tool)),
            (
                "https://weather.example.com/v1".into(),
                OriginSource::Environment
            )
        );
        // Elsewhere the tool is caller-hosted.
        assert_eq!(
            Ctx::new()
                .env("dev")
                .select(&tool)
                .unwrap_err()
                .origin_source,
            OriginSource::Callback
        );
    }

    #[test]
    fn an_unregistered_origin_is_refused_by_name() {
        let err = Ctx::new()
            .callback("https://evil.example.net/cb", &["app.example.com"])
            .select(&tool(Some("/weather")))
            .unwrap_err();
        assert_eq!(err.origin_source, OriginSource::Callback);
        assert_eq!(
            err.target_url.as_deref(),
            Some("https://evil.example.net/weather")
        );
        let text = message(&err);
        assert!(text.contains("https://evil.example.net"), "{text}");
        assert!(!text.contains("secret-token"));
    }

    #[test]
    fn with_no_origins_registered_caller_hosted_tools_do_not_run() {
        let err = Ctx::new()
            .callback("https://app.example.com", &[])
            .select(&tool(Some("/weather")))
            .unwrap_err();
        assert_eq!(
            message(&err),
            "no callback origins are registered for this tenant: caller-hosted tools do not run"
        );
        // The legacy redirect of an absolute URL is held to the same rule.
        let err = Ctx::new()
            .callback("https://app.example.com", &[])
            .select(&tool(Some("https://api.example.com/w")))
            .unwrap_err();
        assert_eq!(err.origin_source, OriginSource::Callback);
    }

    #[test]
    fn wildcard_origins_match_subdomains_only() {
        let weather = tool(Some("/weather"));
        let select = |callback: &str| {
            Ctx::new()
                .callback(callback, &["*.example.com"])
                .select(&weather)
        };
        assert_eq!(
            ok(select("https://api.example.com")).0,
            "https://api.example.com/weather"
        );
        assert!(select("https://example.com").is_err());
        assert!(select("https://badexample.com").is_err());
    }

    #[test]
    fn port_and_scheme_must_match_when_registered() {
        let weather = tool(Some("/weather"));
        let select = |callback: &str| {
            Ctx::new()
                .callback(callback, &["https://app.example.com:8443"])
                .select(&weather)
        };
        assert!(select("https://app.example.com:8443/").is_ok());
        assert!(select("https://app.example.com:9443/").is_err());
        assert!(select("http://app.example.com:8443/").is_err());
    }

    #[test]
    fn a_callback_url_that_is_not_http_is_refused() {
        let err = Ctx::new()
            .callback("ftp://app.example.com/", &["app.example.com"])
            .select(&tool(Some("/weather")))
            .unwrap_err();
        assert!(message(&err).contains("not an http or https URL"));
    }

    #[test]
    fn a_callback_url_redirects_the_host_of_a_stored_absolute_url() {
        let got = ok(Ctx::new()
            .callback(
                "http://localhost:3000/debug?x=1",
                &["http://localhost:3000"],
            )
            .select(&tool(Some(
                "https://user:pw@api.example.com/v1/weather?unit=c#f",
            ))));
        // Scheme, host and port come from the callback; path and query stay; the stored
        // credentials are not sent to the caller.
        assert_eq!(
            got,
            (
                "http://localhost:3000/v1/weather?unit=c".into(),
                OriginSource::Callback
            )
        );
    }

    #[test]
    fn an_environment_pinned_absolute_url_is_not_redirected() {
        let got = ok(Ctx::new()
            .env("staging")
            .callback("http://localhost:3000", &["http://localhost:3000"])
            .select(&pinned(Some("https://default.example.com/w"))));
        assert_eq!(
            got,
            (
                "https://staging.example.com/w".into(),
                OriginSource::Environment
            )
        );
    }

    #[test]
    fn placeholders_are_filled_and_percent_encoded() {
        let ctx = Ctx::new()
            .param("city", "São Paulo/&x=1")
            .param("region", "eu-west_1");
        assert_eq!(
            ok(ctx.select(&tool(Some(
                "https://[[region]].api.example.com/w/[[city]]?c=[[city]]"
            ))))
            .0,
            "https://eu-west_1.api.example.com/w/S%C3%A3o%20Paulo%2F%26x%3D1?c=S%C3%A3o%20Paulo%2F%26x%3D1"
        );
        let ctx = ctx.callback("https://app.example.com", &["app.example.com"]);
        assert_eq!(
            ok(ctx.select(&tool(Some("/weather/[[region]]?city=[[city]]")))).0,
            "https://app.example.com/weather/eu-west_1?city=S%C3%A3o%20Paulo%2F%26x%3D1"
        );
    }

    #[test]
    fn a_value_cannot_move_the_host() {
        let err = Ctx::new()
            .param("region", "evil.example.net/")
            .select(&tool(Some("https://[[region]]/w")));
        // `/` is encoded, which no host may contain.
        assert!(err.is_err());
    }

    #[test]
    fn a_missing_parameter_is_named() {
        let err = Ctx::new()
            .select(&tool(Some("https://api.example.com/w?city=[[city]]")))
            .unwrap_err();
        assert_eq!(err.origin_source, OriginSource::Tool);
        assert_eq!(
            message(&err),
            "tool 'weather': webUrl needs the request parameter 'city', which the run did not receive"
        );
        let err = Ctx::new()
            .callback("https://app.example.com", &["app.example.com"])
            .select(&tool(Some("/w/[[city]]")))
            .unwrap_err();
        assert_eq!(err.origin_source, OriginSource::Callback);
        assert!(message(&err).contains("'city'"));
    }

    #[test]
    fn malformed_placeholders_are_refused() {
        for url in ["/w?c=[[City]]", "/w?c=[[city", "/w?c=[[]]"] {
            let err = Ctx::new()
                .param("city", "x")
                .callback("https://app.example.com", &["app.example.com"])
                .select(&tool(Some(url)))
                .unwrap_err();
            assert!(message(&err).contains("webUrl"), "{url}");
        }
    }

    #[test]
    fn arguments_become_query_pairs() {
        let arguments = json!({
            "city": "Paris", "days": 3, "metric": true, "tags": ["a", "b", 7],
            "filter": {"min": 1}, "skipped": null,
        });
        // Sorted by name (stably, so a list keeps its order): the order of a JSON object's keys
        // depends on serde_json's features.
        let mut pairs = query_pairs(arguments.as_object().unwrap());
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let expected: Vec<(String, String)> = [
            ("city", "Paris"),
            ("days", "3"),
            ("filter", r#"{"min":1}"#),
            ("metric", "true"),
            ("tags", "a"),
            ("tags", "b"),
            ("tags", "7"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
        assert_eq!(pairs, expected);
    }

    #[test]
    fn origin_sources_serialise_lowercase() {
        assert_eq!(
            serde_json::to_value([
                OriginSource::Tool,
                OriginSource::Environment,
                OriginSource::Callback
            ])
            .unwrap(),
            json!(["tool", "environment", "callback"])
        );
    }

    #[test]
    fn error_bodies_are_shortened() {
        assert_eq!(shorten("  short  ", 10), "short");
        assert_eq!(shorten("ééééé", 3), "ééé...");
    }
}
