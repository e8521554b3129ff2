//! What every model-calling endpoint does around the call itself: the tenant's rate limit, the
//! model chain resolved (DESIGN.md "Model resolution", see `baton_providers::routing`), attempt
//! time limits, and the response cache. The call goes through the shared router.

use std::time::Instant;

use baton_domain::TenantId;
use baton_domain::chat::{
    InferenceRequest, InferenceResponse, ResponseAccumulator, StreamDelta, Usage,
};
use baton_domain::run::Attempt;
use baton_domain::settings::{TenantSettings, validate_timeout_ms};
use baton_providers::routing::{
    AttemptTimeouts, Chain, ChainFailure, ChainModel, ModelSelection, Named, StreamStart, resolve,
};
use baton_providers::structured::OutputSchema;
use baton_providers::{DeltaStream, ProviderError};
use futures::StreamExt;
use serde::Deserialize;
use tracing::Instrument;

use crate::cache::{CacheFill, CacheSlot, ResponseCache, replay};
use crate::engine::Engine;
use crate::error::{ExecutorError, ExecutorResult};
use crate::runlog::{Pricing, RunLog};

/// A request's own per-attempt time limits, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RequestTimeouts {
    /// Until a stream's response headers.
    #[serde(default)]
    pub connect_ms: Option<u64>,
    /// Until a stream's first token.
    #[serde(default)]
    pub first_token_ms: Option<u64>,
    /// The whole attempt.
    #[serde(default)]
    pub total_ms: Option<u64>,
}

impl RequestTimeouts {
    pub fn validated(self, param: &str) -> ExecutorResult<RequestTimeouts> {
        for (value, name) in [
            (self.connect_ms, "connect_ms"),
            (self.first_token_ms, "first_token_ms"),
            (self.total_ms, "total_ms"),
        ] {
            if let Some(ms) = value {
                validate_timeout_ms(ms, &format!("{param}.{name}"))?;
            }
        }
        Ok(self)
    }

    /// The request's limits, else the tenant's.
    fn resolve(self, settings: &TenantSettings) -> AttemptTimeouts {
        let ms = std::time::Duration::from_millis;
        AttemptTimeouts {
            connect: self.connect_ms.or(settings.connect_timeout_ms).map(ms),
            first_token: self
                .first_token_ms
                .or(settings.first_token_timeout_ms)
                .map(ms),
            total: self.total_ms.or(settings.attempt_timeout_ms).map(ms),
        }
    }
}

/// Everything decided before the first model is called.
pub struct CallPlan {
    pub chain: Chain,
    pub timeouts: AttemptTimeouts,
    /// The whole request's deadline: no attempt (or Retry-After wait) runs past it.
    pub deadline: Instant,
    /// Where the answer is cached, when the tenant's cache is on.
    pub cache: Option<CacheSlot>,
}

/// Applies the tenant's rate limit and resolves the request's chain. Errors here happen before
/// anything is logged or billed.
pub async fn plan_call(
    engine: &Engine,
    tenant: &TenantId,
    settings: &TenantSettings,
    selection: ModelSelection<'_>,
    request: &InferenceRequest,
    nonce: Option<&str>,
    timeouts: RequestTimeouts,
) -> ExecutorResult<CallPlan> {
    check_rate_limit(engine, tenant, settings).await?;
    plan_chain(
        engine, tenant, settings, selection, request, nonce, timeouts,
    )
    .await
}

/// Takes one request from the tenant's `requestsPerMinute` (a whole request: its classifier call
/// and sub-agents are part of it, not requests of their own).
pub async fn check_rate_limit(
    engine: &Engine,
    tenant: &TenantId,
    settings: &TenantSettings,
) -> ExecutorResult<()> {
    engine
        .inner
        .limiters
        .check(tenant, settings.requests_per_minute)
        .await
}

/// Resolves a call's chain, limits and cache slot, without taking from the rate limit (for the
/// calls inside a request that was already counted).
pub async fn plan_chain(
    engine: &Engine,
    tenant: &TenantId,
    settings: &TenantSettings,
    selection: ModelSelection<'_>,
    request: &InferenceRequest,
    nonce: Option<&str>,
    timeouts: RequestTimeouts,
) -> ExecutorResult<CallPlan> {
    let rules = engine.routing_rules(tenant).await?;
    let selection = ModelSelection {
        tenant_default: settings.default_model.as_deref(),
        ..selection
    };
    let chain = resolve(&selection, &rules, engine.inner.providers.as_ref())?;
    let cache = ResponseCache::slot(
        tenant,
        &chain.requested,
        request,
        nonce,
        settings.response_cache_ttl_seconds,
    );
    Ok(CallPlan {
        chain,
        timeouts: timeouts.resolve(settings),
        deadline: Instant::now() + engine.inner.config.request_timeout,
        cache,
    })
}

/// Resolves a model name as a call would, without planning one: a request's bad model is
/// refused before anything else (a Route classifier) is called.
pub(crate) async fn check_model(
    engine: &Engine,
    tenant: &TenantId,
    named: Named<'_>,
) -> ExecutorResult<()> {
    let rules = engine.routing_rules(tenant).await?;
    let selection = ModelSelection {
        override_model: Some(named),
        ..ModelSelection::default()
    };
    resolve(&selection, &rules, engine.inner.providers.as_ref())?;
    Ok(())
}

/// A model's answer, from the cache or from the chain.
pub struct Answer<T> {
    pub value: T,
    pub model: ChainModel,
    pub fallback_used: bool,
    pub cached: bool,
}

impl<T> Answer<T> {
    /// The pricing of this answer: nothing when it came from the cache.
    pub fn pricing(&self, pricing: Pricing) -> Pricing {
        if self.cached {
            pricing.for_cached()
        } else {
            pricing
        }
    }

    /// Where a streamed answer is cached once complete (not when it came from the cache).
    pub fn cache_fill(&self, engine: &Engine, plan: &CallPlan) -> Option<CacheFill> {
        plan.cache
            .clone()
            .filter(|_| !self.cached)
            .map(|slot| CacheFill {
                cache: engine.inner.responses.clone(),
                slot,
                model: self.model.clone(),
            })
    }
}

/// A request that got no answer: what to report and what to bill.
pub struct Failure {
    pub error: ExecutorError,
    pub model: Option<ChainModel>,
    pub spent: Usage,
}

impl Failure {
    /// Finishes the log as failed; returns the error for the client.
    pub async fn log(self, log: RunLog) -> ExecutorError {
        let model = self
            .model
            .as_ref()
            .map(|m| (m.provider.as_str(), m.model.as_str()));
        log.fail(model, &self.error, self.spent).await;
        self.error
    }
}

impl From<ExecutorError> for Failure {
    /// A failure before any model was called: nothing spent.
    fn from(error: ExecutorError) -> Self {
        Failure {
            error,
            model: None,
            spent: Usage::default(),
        }
    }
}

/// Fetches `request`'s image URLs when a provider of the chain takes only inline images.
async fn inline_images_if_needed(
    engine: &Engine,
    plan: &CallPlan,
    request: &mut InferenceRequest,
) -> Result<(), Failure> {
    if crate::images::needs_inlining(request, &plan.chain, &engine.inner.providers) {
        crate::images::inline_image_urls(&engine.inner.outbound, request).await?;
    }
    Ok(())
}

impl From<ChainFailure> for Failure {
    fn from(failure: ChainFailure) -> Self {
        Failure {
            error: failure.error.into(),
            model: failure.model,
            spent: failure.spent,
        }
    }
}

/// A served chain's attempts, for the run (and a debug run's kept log lines).
fn served_routing(model: &ChainModel, attempts: Vec<Attempt>, fallback_used: bool) -> Routed {
    tracing::debug!(
        served = %model.model,
        attempts = attempts.len(),
        fallback = fallback_used,
        "model chain answered"
    );
    Routed::Chain {
        attempts,
        fallback_used,
    }
}

fn failed_routing(failure: &mut ChainFailure) -> Routed {
    tracing::info!(
        attempts = failure.attempts.len(),
        error = %failure.error,
        "every model of the chain failed"
    );
    Routed::Chain {
        attempts: std::mem::take(&mut failure.attempts),
        fallback_used: false,
    }
}

/// A synchronous answer: the cached one, else the chain's (then cached).
pub async fn answer(
    engine: &Engine,
    tenant: &TenantId,
    plan: &CallPlan,
    request: &mut InferenceRequest,
    schema: Option<&OutputSchema>,
    log: &mut RunLog,
) -> Result<Answer<InferenceResponse>, Failure> {
    if let Some(slot) = &plan.cache
        && let Some(hit) = engine.inner.responses.get(slot).await
    {
        tracing::debug!("answered from the response cache");
        log.mark_cached();
        return Ok(Answer {
            value: hit.response.clone(),
            model: hit.model.clone(),
            fallback_used: false,
            cached: true,
        });
    }
    inline_images_if_needed(engine, plan, request).await?;
    match engine
        .inner
        .router
        .infer(
            tenant.as_str(),
            &plan.chain,
            request,
            schema,
            plan.timeouts,
            plan.deadline,
        )
        .await
    {
        Ok(served) => {
            served_routing(&served.model, served.attempts, served.fallback_used).note(log);
            if let Some(slot) = &plan.cache {
                engine
                    .inner
                    .responses
                    .put(slot, served.model.clone(), served.value.clone())
                    .await;
            }
            Ok(Answer {
                value: served.value,
                model: served.model,
                fallback_used: served.fallback_used,
                cached: false,
            })
        }
        Err(mut failure) => {
            failed_routing(&mut failure).note(log);
            Err(failure.into())
        }
    }
}

/// A stream: the cached answer replayed, else the first model of the chain whose stream
/// started. Nothing has reached the client yet, so failures here are ordinary error responses.
pub async fn open_stream(
    engine: &Engine,
    tenant: &TenantId,
    plan: &CallPlan,
    request: &mut InferenceRequest,
    log: &mut RunLog,
) -> Result<Answer<DeltaStream>, Failure> {
    let (opened, routed) = open_stream_unlogged(engine, tenant, plan, request).await;
    routed.note(log);
    opened
}

/// How a stream's model was found, for the run's log.
pub enum Routed {
    /// Replayed from the response cache.
    Cached,
    /// The chain's attempts.
    Chain {
        attempts: Vec<Attempt>,
        fallback_used: bool,
    },
    /// Failed before any model was tried (an image could not be fetched).
    Nothing,
}

impl Routed {
    pub fn note(self, log: &mut RunLog) {
        match self {
            Routed::Cached => log.mark_cached(),
            Routed::Chain {
                attempts,
                fallback_used,
            } => log.record_routing(attempts, fallback_used),
            Routed::Nothing => {}
        }
    }
}

/// A stream whose opening is under way: what it came to, how, and where a complete answer is
/// cached.
pub type Opening = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = (
                    Result<Answer<DeltaStream>, Failure>,
                    Routed,
                    Option<CacheFill>,
                ),
            > + Send,
    >,
>;

/// [`open_stream`] on owned inputs and without the run's log, so that an events stream can
/// start (`requestStarted`, heartbeats) while the provider has yet to send its first token: a
/// reasoning model may think for a minute first.
pub fn opening(
    engine: Engine,
    tenant: TenantId,
    plan: CallPlan,
    mut request: InferenceRequest,
) -> Opening {
    // In the request's span, as a handler's own call would be (a debug run keeps its lines).
    Box::pin(
        async move {
            let (opened, routed) =
                open_stream_unlogged(&engine, &tenant, &plan, &mut request).await;
            let fill = opened
                .as_ref()
                .ok()
                .and_then(|answer| answer.cache_fill(&engine, &plan));
            (opened, routed, fill)
        }
        .in_current_span(),
    )
}

/// An [`Opening`] that fails at once with `error` (refused before any model is called).
pub fn refused(error: ExecutorError) -> Opening {
    Box::pin(std::future::ready((
        Err(Failure::from(error)),
        Routed::Nothing,
        None,
    )))
}

async fn open_stream_unlogged(
    engine: &Engine,
    tenant: &TenantId,
    plan: &CallPlan,
    request: &mut InferenceRequest,
) -> (Result<Answer<DeltaStream>, Failure>, Routed) {
    if let Some(slot) = &plan.cache
        && let Some(hit) = engine.inner.responses.get(slot).await
    {
        tracing::debug!("answered from the response cache");
        let answer = Answer {
            value: replay(&hit.response),
            model: hit.model.clone(),
            fallback_used: false,
            cached: true,
        };
        return (Ok(answer), Routed::Cached);
    }
    if let Err(failure) = inline_images_if_needed(engine, plan, request).await {
        return (Err(failure), Routed::Nothing);
    }
    match engine
        .inner
        .router
        .infer_stream(
            tenant.as_str(),
            &plan.chain,
            request,
            plan.timeouts,
            plan.deadline,
        )
        .await
    {
        Ok(served) => {
            let routed = served_routing(&served.model, served.attempts, served.fallback_used);
            let StreamStart { first, rest } = served.value;
            let upstream: DeltaStream = match first {
                Some(first) => Box::pin(futures::stream::once(async { Ok(first) }).chain(rest)),
                None => rest,
            };
            let answer = Answer {
                value: upstream,
                model: served.model,
                fallback_used: served.fallback_used,
                cached: false,
            };
            (Ok(answer), routed)
        }
        Err(mut failure) => {
            let routed = failed_routing(&mut failure);
            (Err(failure.into()), routed)
        }
    }
}

/// A synchronous answer read from a stream, `on_text` told each piece of the answer's text as
/// it arrives: a tool loop's model turns shown token by token on a live events stream
/// (`contentDelta`). As with any stream, a fallback is tried only before the first event; a
/// stream that breaks later fails the turn with what it had produced billed, estimated when
/// the provider had not yet reported usage. The request's deadline bounds the whole read, as it
/// bounds a synchronous call.
pub async fn relayed_answer(
    engine: &Engine,
    tenant: &TenantId,
    plan: &CallPlan,
    request: &mut InferenceRequest,
    log: &mut RunLog,
    mut on_text: impl FnMut(&str) + Send,
) -> Result<Answer<InferenceResponse>, Failure> {
    let opened = open_stream(engine, tenant, plan, request, log).await?;
    let fill = opened.cache_fill(engine, plan);
    let Answer {
        value: mut upstream,
        model,
        fallback_used,
        cached,
    } = opened;
    let mut accumulator = ResponseAccumulator::new(model.model.clone());
    let deadline = tokio::time::sleep_until(plan.deadline.into());
    tokio::pin!(deadline);
    loop {
        let item = tokio::select! {
            item = upstream.next() => item,
            () = &mut deadline => Some(Err(ProviderError::Timeout {
                provider: model.provider.clone(),
                stage: "request deadline",
            })),
        };
        match item {
            Some(Ok(delta)) => {
                if let StreamDelta::Text(text) = &delta {
                    on_text(text);
                }
                accumulator.push(&delta);
            }
            Some(Err(error)) => {
                let mut partial = accumulator.finish();
                log.estimate_unreported(&mut partial);
                return Err(Failure {
                    error: error.into(),
                    model: Some(model),
                    spent: partial.usage,
                });
            }
            None => break,
        }
    }
    let mut response = accumulator.finish();
    log.estimate_unreported(&mut response);
    if let Some(fill) = fill {
        fill.fill(response.clone()).await;
    }
    Ok(Answer {
        value: response,
        model,
        fallback_used,
        cached,
    })
}
