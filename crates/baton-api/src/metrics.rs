//! `/metrics` in the Prometheus text format: HTTP requests and their latency by route, errors by
//! code, and what the invocation log records (runs, tokens, credits, provider attempts,
//! fallbacks), plus the log writer's queue depth and its batches by lane. Request metrics are
//! taken in a middleware; run metrics are counted by the log writer after each batch, off the
//! request path.

use std::borrow::Cow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use baton_domain::run::{RunRecord, RunStatus};
use baton_store::runs::{RunWriter, WrittenRuns};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::error::ApiError;
use crate::overload::Overload;
use crate::state::AppState;

// Request labels allocate nothing per request: static strings, and the matched route shared
// with axum's extension (its clone is a reference count). A label set is cloned into its
// family only the first time it is seen.

/// The route template (`/api/v1/flows/{flowId}`), never the raw path: bounded cardinality.
#[derive(Clone, Debug)]
struct Route(Option<MatchedPath>);

impl Route {
    fn as_str(&self) -> &str {
        self.0.as_ref().map_or("unmatched", MatchedPath::as_str)
    }
}

impl PartialEq for Route {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Route {}

impl Hash for Route {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl EncodeLabelValue for Route {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

/// The method's name; extension methods (not routed anyway) are counted together.
fn method_name(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "OTHER",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: &'static str,
    route: Route,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: &'static str,
    route: Route,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    /// An error code (static), or `HTTP_<status>` for an error response without one.
    code: Cow<'static, str>,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LaneLabels {
    /// `idle` (the writer's idle-priority lane) or `own` (the writer's runtime).
    lane: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    kind: &'static str,
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    /// `<provider>/<model>` that answered (else the one asked for).
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    model: String,
    /// `in`, `out`, `reasoning`, `cached`.
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttemptLabels {
    model: String,
    /// `succeeded`, or the error code that ended the attempt.
    outcome: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 0.5 ms to about 65 s: a gateway's own answers and the slowest model calls alike.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0005, 2.0, 18,
    ))
}

/// Every metric Baton exports, registered once.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: HistogramFamily<RouteLabels>,
    errors: Family<ErrorLabels, Counter>,
    runs: Family<RunLabels, Counter>,
    run_latency: HistogramFamily<ModelLabels>,
    tokens: Family<TokenLabels, Counter>,
    billed_credits: Family<ModelLabels, Counter>,
    raw_credits: Family<ModelLabels, Counter>,
    attempts: Family<AttemptLabels, Counter>,
    fallbacks: Family<ModelLabels, Counter>,
    queue_depth: Gauge,
    lane_batches: Family<LaneLabels, Counter>,
    starved_batches: Counter,
    writer: std::sync::OnceLock<RunWriter>,
    queue_delay: Gauge<f64, AtomicU64>,
    shedding: Gauge,
    overload: std::sync::OnceLock<Arc<Overload>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("baton");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by route and status",
            requests.clone(),
        );
        let latency: HistogramFamily<RouteLabels> = Family::new_with_constructor(latency_histogram);
        registry.register(
            "http_request_duration_seconds",
            "Time to the response head (a stream's first byte), by route",
            latency.clone(),
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "http_errors",
            "Error responses, by error code",
            errors.clone(),
        );
        let runs = Family::<RunLabels, Counter>::default();
        registry.register(
            "runs",
            "Runs written to the invocation log, by kind and status",
            runs.clone(),
        );
        let run_latency: HistogramFamily<ModelLabels> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "run_duration_seconds",
            "Duration of finished runs, by served model",
            run_latency.clone(),
        );
        let tokens = Family::<TokenLabels, Counter>::default();
        registry.register("tokens", "Tokens used, by model and kind", tokens.clone());
        let billed_credits = Family::<ModelLabels, Counter>::default();
        registry.register(
            "billed_credits",
            "Billed cost in credits (1,000,000 = 1 USD), by model",
            billed_credits.clone(),
        );
        let raw_credits = Family::<ModelLabels, Counter>::default();
        registry.register(
            "raw_credits",
            "Catalogue-priced cost in credits, by model",
            raw_credits.clone(),
        );
        let attempts = Family::<AttemptLabels, Counter>::default();
        registry.register(
            "provider_attempts",
            "Model calls tried, by model and outcome",
            attempts.clone(),
        );
        let fallbacks = Family::<ModelLabels, Counter>::default();
        registry.register(
            "fallbacks",
            "Runs answered by a fallback model, by the model that answered",
            fallbacks.clone(),
        );
        let queue_depth = Gauge::default();
        registry.register(
            "log_writer_queue_depth",
            "Invocation log items waiting to be written",
            queue_depth.clone(),
        );
        let lane_batches = Family::<LaneLabels, Counter>::default();
        registry.register(
            "log_writer_batches",
            "Invocation log batches written, by lane: idle (at idle priority, while the writer keeps up) or own (the writer's runtime)",
            lane_batches.clone(),
        );
        let starved_batches = Counter::default();
        registry.register(
            "log_writer_starved_batches",
            "Idle-lane batches that waited over 50 ms for CPU (the next ones go to the writer's runtime for a while)",
            starved_batches.clone(),
        );
        let queue_delay = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "queue_delay_seconds",
            "How long new work waits (load shedding): the runtime's scheduling delay or the longest wait for room in the log queue",
            queue_delay.clone(),
        );
        let shedding = Gauge::default();
        registry.register(
            "overloaded",
            "1 while API requests are refused with 503 OVERLOADED (load shedding)",
            shedding.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            errors,
            runs,
            run_latency,
            tokens,
            billed_credits,
            raw_credits,
            attempts,
            fallbacks,
            queue_depth,
            lane_batches,
            starved_batches,
            writer: std::sync::OnceLock::new(),
            queue_delay,
            shedding,
            overload: std::sync::OnceLock::new(),
        }
    }

    /// The writer whose queue depth is reported.
    pub fn watch_writer(&self, writer: RunWriter) {
        let _ = self.writer.set(writer);
    }

    /// The load-shedding state reported.
    pub fn watch_overload(&self, overload: Arc<Overload>) {
        let _ = self.overload.set(overload);
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        if let Some(overload) = self.overload.get() {
            self.queue_delay.set(overload.queue_delay().as_secs_f64());
            self.shedding.set(i64::from(overload.is_shedding()));
        }
        if let Some(writer) = self.writer.get() {
            self.queue_depth
                .set(i64::try_from(writer.queue_depth()).unwrap_or(i64::MAX));
            // The writer counts; the counters follow it (`fetch_max`: concurrent renders
            // never count twice).
            let counts = writer.lane_counts();
            for (lane, batches) in [("idle", counts.idle_batches), ("own", counts.own_batches)] {
                self.lane_batches
                    .get_or_create(&LaneLabels { lane })
                    .inner()
                    .fetch_max(batches, Ordering::Relaxed);
            }
            self.starved_batches
                .inner()
                .fetch_max(counts.starved_batches, Ordering::Relaxed);
        }
        let mut out = String::with_capacity(16 * 1024);
        if let Err(error) =
            prometheus_client::encoding::text::encode_registry(&mut out, &self.registry)
        {
            tracing::warn!(%error, "could not encode metrics");
        }
        out
    }

    fn observe_request(
        &self,
        route: RouteLabels,
        status: u16,
        seconds: f64,
        error: Option<Cow<'static, str>>,
    ) {
        self.latency.get_or_create(&route).observe(seconds);
        self.requests
            .get_or_create(&RequestLabels {
                method: route.method,
                route: route.route,
                status,
            })
            .inc();
        if let Some(code) = error {
            self.errors
                .get_or_create(&ErrorLabels { code, status })
                .inc();
        }
    }

    fn observe_run(&self, run: &RunRecord) {
        self.runs
            .get_or_create(&RunLabels {
                kind: run.kind.as_str(),
                status: run.status.as_str(),
            })
            .inc();
        for attempt in &run.attempts {
            self.attempts
                .get_or_create(&AttemptLabels {
                    model: attempt.model.clone(),
                    outcome: attempt.outcome.clone(),
                })
                .inc();
        }
        let model = ModelLabels {
            model: run
                .served_model
                .clone()
                .unwrap_or_else(|| run.requested_model.clone()),
        };
        self.run_latency
            .get_or_create(&model)
            .observe(run.duration_ms as f64 / 1000.0);
        for (kind, count) in [
            ("in", run.usage.tokens_in),
            ("out", run.usage.tokens_out),
            ("reasoning", run.usage.reasoning_tokens),
            ("cached", run.usage.cached_tokens),
        ] {
            if count > 0 {
                self.tokens
                    .get_or_create(&TokenLabels {
                        model: model.model.clone(),
                        kind,
                    })
                    .inc_by(count);
            }
        }
        if run.cost_credits > 0 {
            self.billed_credits
                .get_or_create(&model)
                .inc_by(u64::try_from(run.cost_credits).unwrap_or(0));
        }
        if run.raw_cost_credits > 0 {
            self.raw_credits
                .get_or_create(&model)
                .inc_by(u64::try_from(run.raw_cost_credits).unwrap_or(0));
        }
        if run.fallback_used {
            self.fallbacks.get_or_create(&model).inc();
        }
    }
}

impl WrittenRuns for Metrics {
    fn written(&self, records: &[RunRecord]) {
        for run in records.iter().filter(|r| r.status != RunStatus::Pending) {
            self.observe_run(run);
        }
    }
}

/// One request's observation: started when the request enters the middleware stack, counted by
/// its route template and timed to the response head by [`RequestTimer::finish`]. Taken by the
/// request-context middleware, so no layer of its own (a boxed future and a service clone per
/// request) is spent on it.
pub struct RequestTimer {
    started: Instant,
    route: RouteLabels,
}

impl RequestTimer {
    pub fn start(request: &Request) -> RequestTimer {
        RequestTimer {
            started: Instant::now(),
            route: RouteLabels {
                method: method_name(request.method()),
                route: Route(request.extensions().get::<MatchedPath>().cloned()),
            },
        }
    }

    /// When the request arrived.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Counts the response before the error in its extensions is rendered into a body.
    pub fn finish(self, metrics: &Metrics, response: &Response) {
        let error = response.extensions().get::<ApiError>().map(ApiError::code);
        let status = response.status().as_u16();
        let error = match (error, status) {
            (Some(code), _) => Some(Cow::Borrowed(code)),
            (None, 400..) => Some(Cow::Owned(format!("HTTP_{status}"))),
            (None, _) => None,
        };
        metrics.observe_request(
            self.route,
            status,
            self.started.elapsed().as_secs_f64(),
            error,
        );
    }
}

/// `GET /metrics` (no auth, like the health checks).
#[utoipa::path(get, path = "/metrics", tag = "health", security(()),
    responses((status = 200, description = "Metrics in the Prometheus text format", content_type = "text/plain")))]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}
