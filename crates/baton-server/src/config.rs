//! Operator configuration: optional `baton.toml`, overridden by `BATON_*` environment variables
//! (`__` separates nesting levels: `BATON_AUTH__JWT_SECRET` sets `auth.jwt_secret`).

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use baton_api::{ApiConfig, Limits, McpConfig, OverloadConfig, ServeOptions};
use baton_providers::{BUILT_IN, ProvidersConfig};
use baton_store::runs::WriterOptions;
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use baton_providers::routing::{BreakerConfig, RouterConfig};
use baton_tools::GuardPolicy;

use crate::error::ServerError;

pub const DEFAULT_DATABASE_URL: &str = "sqlite://./baton.db";
pub const DEFAULT_BIND: &str = "127.0.0.1:8080";
const DEFAULT_CONFIG_FILE: &str = "baton.toml";

/// Top-level keys; environment variables naming anything else are reported and ignored.
const KNOWN_KEYS: &[&str] = &[
    "bind",
    "database_url",
    "bootstrap_api_key",
    "log_format",
    "database",
    "server",
    "auth",
    "routing",
    "cache",
    "tools",
    "retention",
    "mcp",
    "limits",
    "invocation_log",
    "catalogue_path",
    "providers",
];
/// `BATON_*` variables read elsewhere (tests, the outbound guard), not configuration keys.
const NON_CONFIG_VARS: &[&str] = &["test_database_url", "dev_allow_private_network", "log"];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default = "default_bind")]
    pub bind: SocketAddr,
    /// `sqlite://PATH` (default `./baton.db`) or `postgres://...`.
    #[serde(default = "default_database_url")]
    pub database_url: String,
    /// Registered as the `default` tenant's key on first start instead of a generated one.
    #[serde(default)]
    pub bootstrap_api_key: Option<SecretString>,
    #[serde(default)]
    pub log_format: LogFormat,
    #[serde(default)]
    pub database: DatabaseConfig,
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub auth: AuthConfig,
    #[serde(default)]
    pub routing: RoutingConfig,
    #[serde(default)]
    pub cache: CacheConfig,
    #[serde(default)]
    pub tools: ToolsConfig,
    #[serde(default)]
    pub retention: RetentionConfig,
    #[serde(default)]
    pub mcp: McpSection,
    #[serde(default)]
    pub limits: LimitsConfig,
    #[serde(default)]
    pub invocation_log: InvocationLogConfig,
    /// Exact addresses the outbound guard lets through although they are private (test servers
    /// on loopback). Not configurable from files or the environment, on purpose.
    #[serde(skip)]
    pub outbound_allowed: Vec<SocketAddr>,
    /// A model catalogue file replacing the one shipped with Baton.
    #[serde(default)]
    pub catalogue_path: Option<PathBuf>,
    /// Per provider key: base URL, credentials, timeouts; other keys declare extra
    /// OpenAI-compatible providers.
    #[serde(default)]
    pub providers: ProvidersConfig,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    pub max_connections: u32,
    pub acquire_timeout_secs: u64,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            max_connections: 16,
            acquire_timeout_secs: 10,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub max_body_bytes: usize,
    pub request_timeout_secs: u64,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace_secs: u64,
    /// Load shedding: the queueing delay (the runtime's scheduling delay, or requests' wait for
    /// room in the log queue) tolerated as a standing queue before API requests are refused
    /// with 503 `OVERLOADED`; 0 turns shedding off.
    pub shed_queue_delay_ms: u64,
    /// How long that delay must stay above `shed_queue_delay_ms` before shedding starts.
    pub shed_interval_ms: u64,
    /// Serving threads, each a single-threaded runtime with its own listener on the port
    /// (`docs/performance.md`, "Thread per core"); 0: one per CPU.
    pub threads: usize,
    /// How long a connection has to send a request's headers, from when it connects or from
    /// its previous response (so also how long a keep-alive connection may stay idle); past it
    /// the connection is closed. 0: no deadline.
    pub header_read_timeout_secs: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        let api = ApiConfig::default();
        Self {
            max_body_bytes: api.max_body_bytes,
            request_timeout_secs: api.request_timeout.as_secs(),
            shutdown_grace_secs: 30,
            shed_queue_delay_ms: u64::try_from(api.overload.target_delay.as_millis())
                .unwrap_or(u64::MAX),
            shed_interval_ms: u64::try_from(api.overload.interval.as_millis()).unwrap_or(u64::MAX),
            threads: 0,
            header_read_timeout_secs: api
                .connections
                .header_read_timeout
                .map_or(0, |timeout| timeout.as_secs()),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// HS256 key for session tokens (32+ bytes). Absent: generated once and kept in the database.
    pub jwt_secret: Option<SecretString>,
    pub session_ttl_secs: u64,
    pub login_attempts_per_minute: u32,
}

impl Default for AuthConfig {
    fn default() -> Self {
        let api = ApiConfig::default();
        Self {
            jwt_secret: None,
            session_ttl_secs: api.session_ttl.as_secs(),
            login_attempts_per_minute: api.login_attempts_per_minute.get(),
        }
    }
}

/// The model router's circuit breakers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    /// Consecutive retryable failures that open a model's breaker.
    pub breaker_failure_threshold: u32,
    /// How long an open breaker skips its model before one probe request.
    pub breaker_cooldown_ms: u64,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        let breaker = BreakerConfig::default();
        Self {
            breaker_failure_threshold: breaker.threshold,
            breaker_cooldown_ms: u64::try_from(breaker.cooldown.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Bound on the response cache (tenants opt in with `responseCacheTtlSeconds`).
    pub response_cache_max_bytes: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            response_cache_max_bytes: ApiConfig::default().response_cache_max_bytes,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolsConfig {
    /// Bound on one tool call (External, MCP), connection included.
    pub call_timeout_ms: u64,
    /// Bound on connecting to a tool host or MCP server.
    pub connect_timeout_ms: u64,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        let api = ApiConfig::default();
        Self {
            call_timeout_ms: u64::try_from(api.tool_call_timeout.as_millis()).unwrap_or(30_000),
            connect_timeout_ms: u64::try_from(api.tool_connect_timeout.as_millis())
                .unwrap_or(10_000),
        }
    }
}

/// Abuse limits (`docs/reliability.md` "Abuse limits"). The request body bound is
/// `[server] max_body_bytes`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Messages in one chat or inference request (400 `VALIDATION_ERROR` naming `messages`).
    pub max_messages: usize,
    /// Bytes of one tool result, counted while reading; more fails the tool call.
    pub max_tool_result_bytes: usize,
    /// Lifetime of an event stream; then it ends with an `error` event.
    pub max_stream_duration_secs: u64,
    /// Agent and CritiqueLoop calls one model turn may start; the excess calls fail.
    pub max_agent_calls_per_turn: usize,
    /// Open event streams per tenant (per instance); the next one gets 429 `RATE_LIMITED`.
    pub max_streams_per_tenant: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let limits = Limits::default();
        Self {
            max_messages: limits.max_messages,
            max_tool_result_bytes: limits.max_tool_result_bytes,
            max_stream_duration_secs: limits.max_stream_duration.as_secs(),
            max_agent_calls_per_turn: limits.max_agent_calls_per_turn,
            max_streams_per_tenant: limits.max_streams_per_tenant,
        }
    }
}

impl LimitsConfig {
    fn limits(&self) -> Result<Limits, ServerError> {
        let positive = |value: u64, key: &str| {
            if value == 0 {
                Err(ServerError::Config(format!(
                    "limits.{key} must be at least 1"
                )))
            } else {
                Ok(())
            }
        };
        let size = |value: usize| u64::try_from(value).unwrap_or(u64::MAX);
        positive(size(self.max_messages), "max_messages")?;
        positive(size(self.max_tool_result_bytes), "max_tool_result_bytes")?;
        positive(self.max_stream_duration_secs, "max_stream_duration_secs")?;
        positive(size(self.max_streams_per_tenant), "max_streams_per_tenant")?;
        // Zero agent calls per turn is allowed: it turns sub-agents off.
        Ok(Limits {
            max_messages: self.max_messages,
            max_tool_result_bytes: self.max_tool_result_bytes,
            max_stream_duration: Duration::from_secs(self.max_stream_duration_secs),
            max_agent_calls_per_turn: self.max_agent_calls_per_turn,
            max_streams_per_tenant: self.max_streams_per_tenant,
        })
    }
}

/// The background pass that strips text older than each tenant's `textRetentionDays`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Seconds between passes (0 turns the cleanup off).
    pub cleanup_interval_secs: u64,
    /// Runs stripped per statement batch.
    pub cleanup_batch: u64,
    /// Seconds between sweeps finishing runs left `Pending` by a process that died or gave its
    /// final rows up (0: only the sweep at start-up). Batches are `cleanup_batch` runs.
    pub abandoned_sweep_interval_secs: u64,
    /// Added to the longest a run lives on a live instance (`server.request_timeout_secs` plus
    /// `limits.max_stream_duration_secs`) to make the age past which a `Pending` run is
    /// finished as `RUN_ABANDONED`: room for clock skew between instances and the log writer's
    /// queue.
    pub abandoned_margin_secs: u64,
    /// Seconds between sweeps sending budget alerts that no process sent (0: only the sweep at
    /// start-up).
    pub alert_sweep_interval_secs: u64,
    /// Age, in seconds, past which an alert with no delivery recorded is sent by the sweep: its
    /// own process sends it within about a minute of recording it (five attempts), so a
    /// shorter age may send an alert twice while that process still tries.
    pub alert_resend_after_secs: u64,
    /// Seconds after an alert's round of five attempts failed before the sweep sends it again;
    /// doubled after each further failed round, for eight rounds in all.
    pub alert_retry_after_secs: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            cleanup_interval_secs: 3600,
            cleanup_batch: 500,
            abandoned_sweep_interval_secs: 300,
            abandoned_margin_secs: 600,
            alert_sweep_interval_secs: 60,
            alert_resend_after_secs: 120,
            alert_retry_after_secs: 300,
        }
    }
}

impl Config {
    /// When budget alerts that no process sent, or whose delivery failed, are sent again.
    pub fn alert_resend(&self) -> baton_api::budgets::AlertResend {
        let retention = &self.retention;
        baton_api::budgets::AlertResend {
            after: Duration::from_secs(retention.alert_resend_after_secs),
            every: (retention.alert_sweep_interval_secs > 0)
                .then(|| Duration::from_secs(retention.alert_sweep_interval_secs)),
            retry_after: Duration::from_secs(retention.alert_retry_after_secs),
        }
    }

    /// How long a run may stay `Pending` before the sweep finishes it as abandoned.
    pub fn abandoned_run_age(&self) -> Duration {
        Duration::from_secs(
            self.server
                .request_timeout_secs
                .saturating_add(self.limits.max_stream_duration_secs)
                .saturating_add(self.retention.abandoned_margin_secs),
        )
    }

    /// `server.threads`, with 0 resolved to the CPUs this process may run on.
    pub fn serving_threads(&self) -> usize {
        match self.server.threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            threads => threads,
        }
    }
}

/// `[invocation_log]`: not `[log]`, which `BATON_LOG` (the log filter) would collide with.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InvocationLogConfig {
    /// Off: runs are not written, so the invocation log, statistics, usage and budget spend
    /// stay empty (a throughput-only deployment; `docs/decisions.md`).
    pub enabled: bool,
    /// Most runs the log writer commits in one transaction.
    pub batch_max_runs: usize,
    /// How long the writer waits for a batch to fill once a run is queued: the longest a
    /// finished run waits before `/llm-logs`, statistics and budgets see it. Longer batches
    /// cost less CPU per request; shorter ones shorten each commit (docs/performance.md,
    /// "Batch size and the concurrency-1 tail").
    pub batch_max_delay_ms: u64,
    /// `idle` (default): batches are written on a thread at idle scheduling priority while the
    /// writer keeps up, so a commit does not keep a request waiting for a CPU; `normal`: on the
    /// writer's own runtime (docs/performance.md, "The log writer at idle priority").
    pub writer_priority: WriterPriority,
    /// Most rows one statement of the idle lane writes on PostgreSQL (1-1,024; a batch stays
    /// one transaction): the database server runs a statement in one go at normal priority,
    /// and a shorter one frees its CPU sooner for a request that wakes meanwhile
    /// (docs/performance.md, "Short statements on the idle lane").
    pub idle_statement_rows: usize,
}

/// Where the log writer writes its batches (`invocation_log.writer_priority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WriterPriority {
    /// On a `SCHED_IDLE` thread (Linux) while the writer keeps up: only on CPU time nothing
    /// else wants.
    #[default]
    Idle,
    /// On the writer's own runtime, at the scheduler's default priority.
    Normal,
}

/// Rows per idle-lane statement on PostgreSQL unless configured.
const DEFAULT_IDLE_STATEMENT_ROWS: usize = 32;
/// The largest PostgreSQL array statement the store writes.
const MAX_IDLE_STATEMENT_ROWS: usize = baton_store::ARRAY_ROWS_PER_STATEMENT;

/// A run should reach the log within a minute (a batch's bound is the writer's queue).
const MAX_BATCH_DELAY_MS: u64 = 60_000;

impl Default for InvocationLogConfig {
    fn default() -> Self {
        let writer = WriterOptions::default();
        Self {
            enabled: true,
            batch_max_runs: writer.batch,
            batch_max_delay_ms: u64::try_from(writer.max_delay.as_millis()).unwrap_or(u64::MAX),
            writer_priority: WriterPriority::default(),
            idle_statement_rows: DEFAULT_IDLE_STATEMENT_ROWS,
        }
    }
}

impl InvocationLogConfig {
    /// The writer's options, or an error naming the key out of bounds.
    pub fn writer_options(&self) -> Result<WriterOptions, ServerError> {
        let defaults = WriterOptions::default();
        // A batch larger than the queue could never fill.
        if !(1..=defaults.capacity).contains(&self.batch_max_runs) {
            return Err(ServerError::Config(format!(
                "invocation_log.batch_max_runs must be between 1 and {}, not {}",
                defaults.capacity, self.batch_max_runs
            )));
        }
        if self.batch_max_delay_ms > MAX_BATCH_DELAY_MS {
            return Err(ServerError::Config(format!(
                "invocation_log.batch_max_delay_ms must be at most {MAX_BATCH_DELAY_MS}, not {}",
                self.batch_max_delay_ms
            )));
        }
        if !(1..=MAX_IDLE_STATEMENT_ROWS).contains(&self.idle_statement_rows) {
            return Err(ServerError::Config(format!(
                "invocation_log.idle_statement_rows must be between 1 and {MAX_IDLE_STATEMENT_ROWS}, not {}",
                self.idle_statement_rows
            )));
        }
        Ok(WriterOptions {
            batch: self.batch_max_runs,
            max_delay: Duration::from_millis(self.batch_max_delay_ms),
            ..defaults
        })
    }
}

/// Baton's own MCP server (`/api/v1/mcp`): which `Host` and `Origin` values it accepts
/// (DNS-rebinding protection). A list is an array or a comma-separated string
/// (`BATON_MCP__ALLOWED_HOSTS=baton.example.com,localhost`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpSection {
    /// `name` (any port) or `name:port`; default: localhost, 127.0.0.1, ::1 and the bind
    /// address. An empty list accepts any host (only behind a proxy that checks it).
    #[serde(deserialize_with = "string_list")]
    pub allowed_hosts: Option<Vec<String>>,
    /// `scheme://host[:port|:*]` accepted in `Origin` when a request sends one (browsers);
    /// default: http and https on the loopback names, any port. Requests without `Origin` pass.
    #[serde(deserialize_with = "string_list")]
    pub allowed_origins: Option<Vec<String>>,
}

impl McpSection {
    fn api_config(&self, bind: SocketAddr) -> McpConfig {
        let defaults = McpConfig::default();
        let allowed_hosts = self.allowed_hosts.clone().unwrap_or_else(|| {
            let mut hosts = defaults.allowed_hosts.clone();
            let ip = bind.ip();
            // Binding every interface names no host a client would use.
            if !ip.is_unspecified() && !hosts.contains(&ip.to_string()) {
                hosts.push(ip.to_string());
            }
            hosts
        });
        McpConfig {
            allowed_hosts,
            allowed_origins: self
                .allowed_origins
                .clone()
                .unwrap_or(defaults.allowed_origins),
        }
    }
}

/// A list given as an array, or as one comma-separated string (environment variables).
fn string_list<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum List {
        Items(Vec<String>),
        Joined(String),
    }
    let items = match Option::<List>::deserialize(deserializer)? {
        None => return Ok(None),
        Some(List::Items(items)) => items,
        Some(List::Joined(joined)) => joined.split(',').map(str::to_string).collect(),
    };
    Ok(Some(
        items
            .into_iter()
            .map(|item| item.trim().to_string())
            .filter(|item| !item.is_empty())
            .collect(),
    ))
}

fn default_bind() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}

fn default_database_url() -> String {
    DEFAULT_DATABASE_URL.to_string()
}

impl Config {
    /// Reads `path` (or `./baton.toml` if present) and the environment.
    pub fn load(path: Option<&Path>) -> Result<Config, ServerError> {
        let mut figment = Figment::new();
        match path {
            Some(path) if !path.exists() => {
                return Err(ServerError::Config(format!(
                    "config file {} does not exist",
                    path.display()
                )));
            }
            Some(path) => figment = figment.merge(Toml::file_exact(path)),
            None if Path::new(DEFAULT_CONFIG_FILE).exists() => {
                figment = figment.merge(Toml::file_exact(PathBuf::from(DEFAULT_CONFIG_FILE)));
            }
            None => {}
        }
        Self::from_figment(figment.merge(env_provider()))
    }

    pub fn from_figment(figment: Figment) -> Result<Config, ServerError> {
        figment
            .extract()
            .map_err(|e| ServerError::Config(e.to_string()))
    }

    /// Defaults with the given database, for tests and embedding.
    pub fn for_database(url: &str) -> Result<Config, ServerError> {
        Self::from_figment(Figment::new().merge(Serialized::default("database_url", url)))
    }

    /// Provider settings with each provider's conventional variables (`OPENAI_API_KEY`, ...)
    /// filling what the file and `BATON_PROVIDERS__*` left unset.
    pub fn providers_with_env(&self) -> ProvidersConfig {
        self.providers_with(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    pub fn providers_with(&self, lookup: impl Fn(&str) -> Option<String>) -> ProvidersConfig {
        let mut providers = self.providers.clone();
        for key in BUILT_IN {
            let config = providers.remove(*key).unwrap_or_default();
            providers.insert(key.to_string(), config.with_conventional_env(key, &lookup));
        }
        providers
    }

    pub fn api_config(&self) -> Result<ApiConfig, ServerError> {
        let attempts = NonZeroU32::new(self.auth.login_attempts_per_minute).ok_or_else(|| {
            ServerError::Config("auth.login_attempts_per_minute must be at least 1".into())
        })?;
        if let Some(secret) = &self.auth.jwt_secret
            && secret.expose_secret().len() < baton_api::state::MIN_JWT_SECRET_LEN
        {
            return Err(ServerError::Config(format!(
                "auth.jwt_secret must be at least {} bytes",
                baton_api::state::MIN_JWT_SECRET_LEN
            )));
        }
        // Zero here starts a service that refuses every body, issues expired tokens, times out
        // every call at once or never makes progress: refused at start instead.
        let mut positive = vec![
            (
                "server.max_body_bytes".to_string(),
                self.server.max_body_bytes as u64,
            ),
            ("auth.session_ttl_secs".into(), self.auth.session_ttl_secs),
            (
                "server.request_timeout_secs".into(),
                self.server.request_timeout_secs,
            ),
            (
                "server.shed_interval_ms".into(),
                self.server.shed_interval_ms,
            ),
            ("tools.call_timeout_ms".into(), self.tools.call_timeout_ms),
            (
                "tools.connect_timeout_ms".into(),
                self.tools.connect_timeout_ms,
            ),
            (
                "retention.cleanup_batch".into(),
                self.retention.cleanup_batch,
            ),
        ];
        for (key, provider) in &self.providers {
            if let Some(timeout) = provider.timeout_secs {
                positive.push((format!("providers.{key}.timeout_secs"), timeout));
            }
        }
        if let Some((key, _)) = positive.iter().find(|(_, value)| *value == 0) {
            return Err(ServerError::Config(format!("{key} must be at least 1")));
        }
        Ok(ApiConfig {
            max_body_bytes: self.server.max_body_bytes,
            request_timeout: Duration::from_secs(self.server.request_timeout_secs),
            session_ttl: Duration::from_secs(self.auth.session_ttl_secs),
            login_attempts_per_minute: attempts,
            jwt_secret: self.auth.jwt_secret.clone(),
            response_cache_max_bytes: self.cache.response_cache_max_bytes,
            outbound: self
                .outbound_allowed
                .iter()
                .fold(GuardPolicy::from_env(), |policy, addr| {
                    policy.allowing(*addr)
                }),
            tool_call_timeout: Duration::from_millis(self.tools.call_timeout_ms.max(1)),
            tool_connect_timeout: Duration::from_millis(self.tools.connect_timeout_ms.max(1)),
            mcp: self.mcp.api_config(self.bind),
            limits: self.limits.limits()?,
            invocation_log: self.invocation_log.enabled,
            connections: ServeOptions {
                header_read_timeout: (self.server.header_read_timeout_secs > 0)
                    .then(|| Duration::from_secs(self.server.header_read_timeout_secs)),
            },
            overload: OverloadConfig {
                target_delay: Duration::from_millis(self.server.shed_queue_delay_ms),
                interval: Duration::from_millis(self.server.shed_interval_ms),
            },
            router: RouterConfig {
                breaker: BreakerConfig {
                    threshold: self.routing.breaker_failure_threshold.max(1),
                    cooldown: Duration::from_millis(self.routing.breaker_cooldown_ms),
                },
            },
        })
    }
}

fn env_provider() -> Env {
    Env::prefixed("BATON_").split("__").filter(|key| {
        let key = key.as_str().to_ascii_lowercase();
        let top = key.split('.').next().unwrap_or(&key);
        if KNOWN_KEYS.contains(&top) {
            true
        } else {
            if !NON_CONFIG_VARS.contains(&key.as_str()) && !key.starts_with("test_") {
                // Logging is not set up yet when configuration loads.
                eprintln!(
                    "warning: ignoring BATON_{}: not a configuration key",
                    key.to_uppercase()
                );
            }
            false
        }
    })
}

#[cfg(test)]
// figment's Jail returns its own (large) error type; boxing it would only obscure the tests.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;
    use figment::Jail;

    #[test]
    fn env_overrides_file_with_nesting() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "baton.toml",
                "database_url = \"sqlite://x.db\"\n[server]\nmax_body_bytes = 1024\n",
            )?;
            jail.set_env("BATON_SERVER__MAX_BODY_BYTES", "2048");
            jail.set_env("BATON_AUTH__LOGIN_ATTEMPTS_PER_MINUTE", "3");
            jail.set_env("BATON_LOG_FORMAT", "json");
            jail.set_env("BATON_TEST_DATABASE_URL", "ignored");
            // DESIGN.md's operator contract names these two.
            jail.set_env(
                "BATON_PROVIDERS__OPENAI__BASE_URL",
                "http://localhost:9000/v1",
            );
            jail.set_env("BATON_PROVIDERS__OPENAI__API_KEY", "sk-env");
            jail.set_env("BATON_ROUTING__BREAKER_COOLDOWN_MS", "1500");
            jail.set_env("BATON_LIMITS__MAX_STREAMS_PER_TENANT", "7");
            jail.set_env("BATON_INVOCATION_LOG__ENABLED", "false");
            let config = Config::load(None).map_err(|e| e.to_string())?;
            assert!(!config.invocation_log.enabled);
            let openai = &config.providers["openai"];
            assert_eq!(openai.base_url.as_deref(), Some("http://localhost:9000/v1"));
            assert!(openai.api_key.is_some());
            assert_eq!(config.routing.breaker_cooldown_ms, 1500);
            assert_eq!(config.limits.max_streams_per_tenant, 7);
            let limits = config.api_config().map_err(|e| e.to_string())?.limits;
            assert_eq!(limits.max_streams_per_tenant, 7);
            assert_eq!(limits.max_messages, Limits::default().max_messages);
            assert_eq!(config.database_url, "sqlite://x.db");
            assert_eq!(config.server.max_body_bytes, 2048);
            assert_eq!(config.auth.login_attempts_per_minute, 3);
            assert_eq!(config.log_format, LogFormat::Json);
            assert_eq!(config.bind.to_string(), DEFAULT_BIND);
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_in_the_file_are_errors_naming_the_key() {
        Jail::expect_with(|jail| {
            jail.create_file("baton.toml", "[server]\nmax_body_byte = 1\n")?;
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("max_body_byte"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn mcp_hosts_default_to_loopback_and_the_bind_address() {
        Jail::expect_with(|jail| {
            jail.set_env("BATON_BIND", "10.1.2.3:9000");
            let config = Config::load(None).map_err(|e| e.to_string())?;
            let mcp = config.api_config().map_err(|e| e.to_string())?.mcp;
            assert_eq!(
                mcp.allowed_hosts,
                ["localhost", "127.0.0.1", "::1", "10.1.2.3"]
            );
            assert!(
                mcp.allowed_origins
                    .contains(&"http://localhost:*".to_string())
            );
            Ok(())
        });
    }

    #[test]
    fn mcp_lists_come_from_the_file_or_a_comma_separated_variable() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "baton.toml",
                "[mcp]\nallowed_origins = [\"https://app.example.com\"]\n",
            )?;
            jail.set_env(
                "BATON_MCP__ALLOWED_HOSTS",
                "baton.example.com, localhost:8080",
            );
            let config = Config::load(None).map_err(|e| e.to_string())?;
            let mcp = config.api_config().map_err(|e| e.to_string())?.mcp;
            assert_eq!(mcp.allowed_hosts, ["baton.example.com", "localhost:8080"]);
            assert_eq!(mcp.allowed_origins, ["https://app.example.com"]);
            Ok(())
        });
    }

    #[test]
    fn a_zero_limit_is_refused_naming_the_key() {
        Jail::expect_with(|jail| {
            jail.create_file("baton.toml", "[limits]\nmax_stream_duration_secs = 0\n")?;
            let config = Config::load(None).map_err(|e| e.to_string())?;
            let err = config.api_config().unwrap_err().to_string();
            assert!(err.contains("limits.max_stream_duration_secs"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn values_that_would_break_every_request_are_refused_naming_the_key() {
        for (file, key) in [
            ("[server]\nmax_body_bytes = 0\n", "server.max_body_bytes"),
            ("[auth]\nsession_ttl_secs = 0\n", "auth.session_ttl_secs"),
            ("[auth]\njwt_secret = \"short\"\n", "auth.jwt_secret"),
            (
                "[server]\nrequest_timeout_secs = 0\n",
                "server.request_timeout_secs",
            ),
            ("[tools]\ncall_timeout_ms = 0\n", "tools.call_timeout_ms"),
            (
                "[providers.openai]\ntimeout_secs = 0\n",
                "providers.openai.timeout_secs",
            ),
        ] {
            Jail::expect_with(|jail| {
                jail.create_file("baton.toml", file)?;
                let config = Config::load(None).map_err(|e| e.to_string())?;
                let err = config.api_config().unwrap_err().to_string();
                assert!(err.contains(key), "{err}");
                Ok(())
            });
        }
    }

    #[test]
    fn defaults() {
        Jail::expect_with(|_| {
            let config = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(config.database_url, DEFAULT_DATABASE_URL);
            assert!(config.invocation_log.enabled);
            assert!(config.api_config().is_ok());
            let writer = config
                .invocation_log
                .writer_options()
                .map_err(|e| e.to_string())?;
            assert_eq!(writer.batch, WriterOptions::default().batch);
            assert_eq!(writer.max_delay, WriterOptions::default().max_delay);
            Ok(())
        });
    }

    #[test]
    fn the_header_deadline_defaults_to_30_seconds_and_zero_turns_it_off() {
        Jail::expect_with(|jail| {
            for (variable, expected) in [
                (None, Some(Duration::from_secs(30))),
                (Some("5"), Some(Duration::from_secs(5))),
                (Some("0"), None),
            ] {
                if let Some(value) = variable {
                    jail.set_env("BATON_SERVER__HEADER_READ_TIMEOUT_SECS", value);
                }
                let config = Config::load(None).map_err(|e| e.to_string())?;
                let api = config.api_config().map_err(|e| e.to_string())?;
                assert_eq!(
                    api.connections.header_read_timeout, expected,
                    "{variable:?}"
                );
            }
            Ok(())
        });
    }

    #[test]
    fn log_batches_are_configurable_from_the_file_or_the_environment() {
        Jail::expect_with(|jail| {
            jail.create_file("baton.toml", "[invocation_log]\nbatch_max_runs = 32\n")?;
            jail.set_env("BATON_INVOCATION_LOG__BATCH_MAX_DELAY_MS", "20");
            jail.set_env("BATON_INVOCATION_LOG__IDLE_STATEMENT_ROWS", "64");
            let config = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(config.invocation_log.idle_statement_rows, 64);
            let writer = config
                .invocation_log
                .writer_options()
                .map_err(|e| e.to_string())?;
            assert_eq!(writer.batch, 32);
            assert_eq!(writer.max_delay, Duration::from_millis(20));
            Ok(())
        });
    }

    #[test]
    fn the_writer_priority_defaults_to_idle_and_names_its_key_when_wrong() {
        Jail::expect_with(|jail| {
            let config = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(config.invocation_log.writer_priority, WriterPriority::Idle);
            assert_eq!(config.invocation_log.idle_statement_rows, 32);
            jail.set_env("BATON_INVOCATION_LOG__WRITER_PRIORITY", "normal");
            let config = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(
                config.invocation_log.writer_priority,
                WriterPriority::Normal
            );
            jail.set_env("BATON_INVOCATION_LOG__WRITER_PRIORITY", "high");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.to_lowercase().contains("writer_priority"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn log_batches_out_of_bounds_are_refused_naming_the_key() {
        Jail::expect_with(|jail| {
            for (toml, key) in [
                ("batch_max_runs = 0", "invocation_log.batch_max_runs"),
                ("batch_max_runs = 10001", "invocation_log.batch_max_runs"),
                (
                    "batch_max_delay_ms = 60001",
                    "invocation_log.batch_max_delay_ms",
                ),
                (
                    "idle_statement_rows = 0",
                    "invocation_log.idle_statement_rows",
                ),
                (
                    "idle_statement_rows = 1025",
                    "invocation_log.idle_statement_rows",
                ),
            ] {
                jail.create_file("baton.toml", &format!("[invocation_log]\n{toml}\n"))?;
                let config = Config::load(None).map_err(|e| e.to_string())?;
                let err = config
                    .invocation_log
                    .writer_options()
                    .unwrap_err()
                    .to_string();
                assert!(err.contains(key), "{toml}: {err}");
            }
            Ok(())
        });
    }
}
