//! Calling a chain: each planned model in turn until one answers. Retryable failures (429, 5xx,
//! timeouts, connection errors) move on; any other failure ends the chain, since the next model
//! would refuse the same request. A stream counts as answered once its first delta arrived:
//! after that nothing has been promised to the client that another model could keep.

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_domain::chat::{InferenceRequest, InferenceResponse, StreamDelta, Usage};
use baton_domain::run::Attempt;
use futures::StreamExt;

use super::{Chain, ChainModel, Router};
use crate::structured::{OutputSchema, infer_checked};
use crate::{DeltaStream, Provider, ProviderError};

/// Per-attempt time limits; `None` leaves a limit to the request's deadline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttemptTimeouts {
    /// Until the provider's response headers (streams).
    pub connect: Option<Duration>,
    /// From the attempt's start until the first delta, the wait for the headers included
    /// (streams).
    pub first_token: Option<Duration>,
    /// The whole attempt: the answer (synchronous calls) or the last delta (streams).
    pub total: Option<Duration>,
}

/// A chain's answer and how it was reached.
pub struct Served<T> {
    pub value: T,
    pub model: ChainModel,
    pub provider: Arc<dyn Provider>,
    /// The answering model is not the first one planned.
    pub fallback_used: bool,
    pub attempts: Vec<Attempt>,
}

/// A stream whose first delta has arrived (or which ended without any).
pub struct StreamStart {
    pub first: Option<StreamDelta>,
    pub rest: DeltaStream,
}

/// Every planned model failed, or one failed in a way another model cannot fix.
#[derive(Debug)]
pub struct ChainFailure {
    pub error: ProviderError,
    pub attempts: Vec<Attempt>,
    /// The model of the last attempt.
    pub model: Option<ChainModel>,
    /// Tokens spent by failed attempts that still cost (structured-output retries).
    pub spent: Usage,
}

enum Mode<'a> {
    Sync(Option<&'a OutputSchema>),
    Stream,
}

enum Answer {
    Response(InferenceResponse),
    Stream(StreamStart),
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn limit(attempt: Option<Duration>, deadline: Instant) -> Duration {
    let remaining = deadline.saturating_duration_since(Instant::now());
    attempt.map_or(remaining, |a| a.min(remaining))
}

impl Router {
    /// A synchronous answer from the first model of the plan that gives one; a `schema` is
    /// checked (and retried once) per model.
    pub async fn infer(
        &self,
        scope: &str,
        chain: &Chain,
        request: &mut InferenceRequest,
        schema: Option<&OutputSchema>,
        timeouts: AttemptTimeouts,
        deadline: Instant,
    ) -> Result<Served<InferenceResponse>, ChainFailure> {
        let served = self
            .run(
                scope,
                chain,
                request,
                Mode::Sync(schema),
                timeouts,
                deadline,
            )
            .await?;
        match served.value {
            Answer::Response(response) => Ok(Served {
                value: response,
                model: served.model,
                provider: served.provider,
                fallback_used: served.fallback_used,
                attempts: served.attempts,
            }),
            Answer::Stream(_) => Err(ChainFailure {
                error: ProviderError::InvalidResponse {
                    provider: served.model.provider.clone(),
                    message: "a stream where an answer was expected".into(),
                },
                attempts: served.attempts,
                model: Some(served.model),
                spent: Usage::default(),
            }),
        }
    }

    /// A stream from the first model of the plan whose stream starts: falls back on failures
    /// before the first delta only.
    pub async fn infer_stream(
        &self,
        scope: &str,
        chain: &Chain,
        request: &mut InferenceRequest,
        timeouts: AttemptTimeouts,
        deadline: Instant,
    ) -> Result<Served<StreamStart>, ChainFailure> {
        let served = self
            .run(scope, chain, request, Mode::Stream, timeouts, deadline)
            .await?;
        match served.value {
            Answer::Stream(start) => Ok(Served {
                value: start,
                model: served.model,
                provider: served.provider,
                fallback_used: served.fallback_used,
                attempts: served.attempts,
            }),
            Answer::Response(_) => Err(ChainFailure {
                error: ProviderError::InvalidResponse {
                    provider: served.model.provider.clone(),
                    message: "an answer where a stream was expected".into(),
                },
                attempts: served.attempts,
                model: Some(served.model),
                spent: Usage::default(),
            }),
        }
    }

    async fn run(
        &self,
        scope: &str,
        chain: &Chain,
        request: &mut InferenceRequest,
        mode: Mode<'_>,
        timeouts: AttemptTimeouts,
        deadline: Instant,
    ) -> Result<Served<Answer>, ChainFailure> {
        let plan = self.plan(scope, chain);
        let names: Vec<String> = chain.models.iter().map(ToString::to_string).collect();
        let mut failure = ChainFailure {
            error: ProviderError::Invalid(baton_domain::DomainError::validation(
                "model",
                "the model chain is empty",
            )),
            attempts: Vec::new(),
            model: None,
            spent: Usage::default(),
        };
        let mut skipped = Vec::new();
        let mut tried_any = false;
        // The last failure of a model that was called: an unconfigured provider later in the
        // chain must not turn an outage (502/504, retried by clients) into a 400.
        let mut last_outage: Option<(ProviderError, Option<ChainModel>)> = None;
        for (position, &index) in plan.iter().enumerate() {
            if !self.admit(&names[index]) {
                failure.attempts.push(Attempt {
                    model: names[index].clone(),
                    outcome: "skipped_circuit_open".into(),
                    duration_ms: 0,
                });
                skipped.push(index);
                continue;
            }
            tried_any = true;
            let is_last = position + 1 == plan.len();
            match self
                .try_model(
                    chain,
                    index,
                    &names[index],
                    request,
                    &mode,
                    timeouts,
                    deadline,
                    is_last,
                    &mut failure,
                )
                .await
            {
                Some((answer, provider)) => {
                    return Ok(Served {
                        value: answer,
                        model: chain.models[index].clone(),
                        provider,
                        fallback_used: Some(&index) != plan.first(),
                        attempts: std::mem::take(&mut failure.attempts),
                    });
                }
                // An unconfigured provider in a chain is passed over like an outage.
                None if matches!(failure.error, ProviderError::NotConfigured(_)) => continue,
                None if failure.error.is_retryable() => {
                    last_outage = Some((failure.error.clone(), failure.model.clone()));
                    continue;
                }
                None => return Err(failure),
            }
        }
        if matches!(failure.error, ProviderError::NotConfigured(_))
            && let Some((error, model)) = last_outage
        {
            failure.error = error;
            failure.model = model;
        }
        // Every model was in cooldown: rather than refuse, try the one that reopens first.
        if !tried_any
            && let Some(&index) = skipped.iter().min_by_key(|i| self.reopens_at(&names[**i]))
            && let Some((answer, provider)) = self
                .try_model(
                    chain,
                    index,
                    &names[index],
                    request,
                    &mode,
                    timeouts,
                    deadline,
                    true,
                    &mut failure,
                )
                .await
        {
            return Ok(Served {
                value: answer,
                model: chain.models[index].clone(),
                provider,
                fallback_used: Some(&index) != plan.first(),
                attempts: std::mem::take(&mut failure.attempts),
            });
        }
        Err(failure)
    }

    /// One model, tried once, or twice when it is the last hope and its 429 asks for a wait that
    /// fits the deadline. `None` leaves the reason in `failure`.
    #[allow(clippy::too_many_arguments)]
    async fn try_model(
        &self,
        chain: &Chain,
        index: usize,
        name: &str,
        request: &mut InferenceRequest,
        mode: &Mode<'_>,
        timeouts: AttemptTimeouts,
        deadline: Instant,
        is_last: bool,
        failure: &mut ChainFailure,
    ) -> Option<(Answer, Arc<dyn Provider>)> {
        let model = &chain.models[index];
        failure.model = Some(model.clone());
        let provider = match self.registry.get(&model.provider) {
            Ok(provider) => provider.clone(),
            Err(err) => {
                failure.attempts.push(Attempt {
                    model: name.to_string(),
                    outcome: err.outcome().into(),
                    duration_ms: 0,
                });
                failure.error = err;
                return None;
            }
        };
        request.model.clone_from(&model.model);
        let mut waited = false;
        loop {
            let started = Instant::now();
            let result = if started >= deadline {
                Err(ProviderError::Timeout {
                    provider: model.provider.clone(),
                    stage: "request deadline",
                })
            } else {
                attempt(provider.as_ref(), request, mode, timeouts, deadline).await
            };
            let elapsed = started.elapsed();
            match result {
                Ok((answer, latency)) => {
                    self.record_success(name, latency);
                    failure.attempts.push(Attempt {
                        model: name.to_string(),
                        outcome: "succeeded".into(),
                        duration_ms: millis(elapsed),
                    });
                    return Some((answer, provider));
                }
                Err(err) => {
                    tracing::debug!(model = name, error = %err, "model attempt failed");
                    failure.attempts.push(Attempt {
                        model: name.to_string(),
                        outcome: err.outcome().into(),
                        duration_ms: millis(elapsed),
                    });
                    if let Some(spent) = err.spent_usage() {
                        failure.spent.tokens_in += spent.tokens_in;
                        failure.spent.tokens_out += spent.tokens_out;
                        failure.spent.reasoning_tokens += spent.reasoning_tokens;
                        failure.spent.cached_tokens += spent.cached_tokens;
                        failure.spent.web_search_calls += spent.web_search_calls;
                    }
                    let retry_after = err.retry_after().filter(|_| err.status() == Some(429));
                    let retryable = err.is_retryable();
                    failure.error = err;
                    if !retryable {
                        return None;
                    }
                    self.record_failure(name);
                    match retry_after {
                        Some(wait) if is_last && !waited && Instant::now() + wait < deadline => {
                            waited = true;
                            tokio::time::sleep(wait).await;
                        }
                        _ => return None,
                    }
                }
            }
        }
    }
}

/// One call with its time limits. Returns the answer and the latency that ranks the model
/// (whole answer, or first token for streams).
async fn attempt(
    provider: &dyn Provider,
    request: &InferenceRequest,
    mode: &Mode<'_>,
    timeouts: AttemptTimeouts,
    deadline: Instant,
) -> Result<(Answer, Duration), ProviderError> {
    let started = Instant::now();
    let timeout = |stage: &'static str| ProviderError::Timeout {
        provider: provider.key().to_string(),
        stage,
    };
    match mode {
        Mode::Sync(schema) => {
            let response = tokio::time::timeout(
                limit(timeouts.total, deadline),
                infer_checked(provider, request, *schema),
            )
            .await
            .map_err(|_| timeout("total"))??;
            Ok((Answer::Response(response), started.elapsed()))
        }
        Mode::Stream => {
            let attempt_deadline = timeouts.total.and_then(|t| started.checked_add(t));
            let bound = attempt_deadline.map_or(deadline, |d| d.min(deadline));
            // Each limit counts from the attempt's start, so `first_token` also bounds the wait
            // for the headers: a provider slow to answer at all is as slow as one slow to write.
            let by = |own: Option<Duration>| {
                own.map_or(bound, |own| {
                    started.checked_add(own).map_or(bound, |at| at.min(bound))
                })
            };
            let first_by = by(timeouts.first_token);
            let connect_by = by(timeouts.connect);
            let (headers_by, headers_stage) = if first_by < connect_by {
                (first_by, "first token")
            } else {
                (connect_by, "connect")
            };
            let mut stream =
                tokio::time::timeout_at(headers_by.into(), provider.infer_stream(request))
                    .await
                    .map_err(|_| timeout(headers_stage))??;
            let first = tokio::time::timeout_at(first_by.into(), stream.next())
                .await
                .map_err(|_| timeout("first token"))?
                .transpose()?;
            let latency = started.elapsed();
            let rest = match attempt_deadline {
                Some(end) => bounded(stream, end, provider.key().to_string()),
                None => stream,
            };
            Ok((Answer::Stream(StreamStart { first, rest }), latency))
        }
    }
}

/// Ends a stream with a timeout error at `end`.
fn bounded(stream: DeltaStream, end: Instant, provider: String) -> DeltaStream {
    let end = tokio::time::Instant::from_std(end);
    Box::pin(futures::stream::unfold(
        Some((stream, provider)),
        move |state| async move {
            let (mut stream, provider) = state?;
            match tokio::time::timeout_at(end, stream.next()).await {
                Ok(Some(item)) => Some((item, Some((stream, provider)))),
                Ok(None) => None,
                Err(_) => Some((
                    Err(ProviderError::Timeout {
                        provider,
                        stage: "total",
                    }),
                    None,
                )),
            }
        },
    ))
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;
    use baton_domain::chat::FinishReason;
    use baton_domain::routing::Strategy;
    use bytes::Bytes;

    use super::*;
    use crate::routing::{BreakerConfig, RouterConfig};
    use crate::{Catalogue, ProviderResult, ProvidersConfig, Registry};

    /// A provider whose stream's headers come after `headers`, its body from `body`.
    struct Scripted {
        key: &'static str,
        headers: Duration,
        body: fn() -> DeltaStream,
    }

    #[async_trait]
    impl Provider for Scripted {
        fn key(&self) -> &str {
            self.key
        }

        async fn infer(&self, _: &InferenceRequest) -> ProviderResult<InferenceResponse> {
            Err(ProviderError::NotConfigured(self.key.into()))
        }

        async fn infer_stream(&self, _: &InferenceRequest) -> ProviderResult<DeltaStream> {
            tokio::time::sleep(self.headers).await;
            Ok((self.body)())
        }
    }

    fn answer() -> DeltaStream {
        Box::pin(futures::stream::iter([
            Ok(StreamDelta::Text("hi".into())),
            Ok(StreamDelta::Finish(FinishReason::Stop)),
        ]))
    }

    /// The first delta 200 ms after the headers.
    fn slow_answer() -> DeltaStream {
        Box::pin(
            futures::stream::once(async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok(StreamDelta::Text("late".into()))
            })
            .chain(answer()),
        )
    }

    /// An OpenAI body: the role chunk, then `rest`.
    fn after_role(rest: Option<std::io::Error>) -> DeltaStream {
        let role = r#"data: {"model": "m-2025", "choices": [{"delta": {"role": "assistant", "content": ""}}]}"#;
        let bytes = futures::stream::iter(
            [Ok(Bytes::from(format!("{role}\n\n")))]
                .into_iter()
                .chain(rest.map(Err)),
        );
        crate::provider::require_finish("primary", crate::openai::deltas("primary", bytes))
    }

    async fn stream_through(
        primary: Scripted,
        timeouts: AttemptTimeouts,
    ) -> Result<Served<StreamStart>, ChainFailure> {
        let mut registry = Registry::from_config(
            &ProvidersConfig::new(),
            Arc::new(Catalogue::shipped().expect("the shipped catalogue")),
        )
        .expect("an empty configuration");
        registry.insert(Arc::new(primary));
        registry.insert(Arc::new(Scripted {
            key: "backup",
            headers: Duration::ZERO,
            body: answer,
        }));
        let router = Router::new(
            Arc::new(registry),
            RouterConfig {
                breaker: BreakerConfig {
                    threshold: 5,
                    cooldown: Duration::from_secs(30),
                },
            },
        );
        let model = |provider: &str| ChainModel {
            provider: provider.into(),
            model: "m".into(),
        };
        let chain = Chain {
            requested: "alias".into(),
            models: vec![model("primary"), model("backup")],
            strategy: Strategy::Sequential,
            weights: None,
            alias: Some("alias".into()),
            routed: 2,
        };
        router
            .infer_stream(
                "tenant",
                &chain,
                &mut InferenceRequest::default(),
                timeouts,
                Instant::now() + Duration::from_secs(60),
            )
            .await
    }

    /// `first_token` counts from the attempt's start: a provider that holds its headers past it
    /// is timed out and the chain falls back, as is one whose headers come in time but whose
    /// first delta does not.
    #[tokio::test]
    async fn first_token_bounds_the_wait_for_the_headers_too() {
        let timeouts = AttemptTimeouts {
            first_token: Some(Duration::from_millis(300)),
            ..AttemptTimeouts::default()
        };
        for (what, headers, body) in [
            (
                "late headers",
                Duration::from_secs(8),
                answer as fn() -> DeltaStream,
            ),
            (
                "headers, then a late delta",
                Duration::from_millis(200),
                slow_answer,
            ),
        ] {
            let started = Instant::now();
            let served = stream_through(
                Scripted {
                    key: "primary",
                    headers,
                    body,
                },
                timeouts,
            )
            .await
            .unwrap_or_else(|failure| panic!("{what}: {:?}", failure.error));
            assert_eq!(served.model.provider, "backup", "{what}");
            assert!(served.fallback_used, "{what}");
            assert_eq!(served.attempts[0].outcome, "timeout", "{what}");
            assert!(started.elapsed() < Duration::from_secs(2), "{what}");
        }
    }

    /// A body that breaks, or ends, after the role chunk and before any content falls back:
    /// the client has seen nothing yet.
    #[tokio::test]
    async fn a_stream_cut_before_its_first_delta_falls_back() {
        for (what, body) in [
            (
                "broken",
                (|| after_role(Some(std::io::Error::other("connection reset"))))
                    as fn() -> DeltaStream,
            ),
            ("ended", || after_role(None)),
        ] {
            let served = stream_through(
                Scripted {
                    key: "primary",
                    headers: Duration::ZERO,
                    body,
                },
                AttemptTimeouts::default(),
            )
            .await
            .unwrap_or_else(|failure| panic!("{what}: {:?}", failure.error));
            assert_eq!(served.model.provider, "backup", "{what}");
            assert_eq!(served.attempts[0].outcome, "connection_error", "{what}");
            assert_eq!(
                served.value.first,
                Some(StreamDelta::Text("hi".into())),
                "{what}"
            );
        }
    }
}
