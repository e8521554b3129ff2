//! Routing: which models may serve a request ([`resolve`]), in which order ([`Router::plan`],
//! by the chain's strategy and the models' circuit breakers), and calling them in that order
//! until one answers ([`Router::infer`], [`Router::infer_stream`] in `execute`).
//!
//! The router's state (breakers, rotation counters, latency averages) is per instance, as
//! DESIGN.md "Scale" allows.

mod breaker;
mod execute;
pub mod resolve;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use baton_domain::routing::Strategy;

pub use breaker::BreakerConfig;
pub use execute::{AttemptTimeouts, ChainFailure, Served, StreamStart};
pub use resolve::{Chain, ChainModel, ModelSelection, Named, RuleSet, resolve};

use crate::Registry;
use breaker::Breaker;

/// Models, aliases and tenants tracked at most; beyond it new keys go untracked (plain
/// sequential behaviour) rather than letting arbitrary model names grow memory.
const MAX_TRACKED: usize = 50_000;
/// Weight of the newest sample in the latency moving average.
const LATENCY_ALPHA: f64 = 0.3;

#[derive(Debug, Clone, Copy, Default)]
pub struct RouterConfig {
    pub breaker: BreakerConfig,
}

#[derive(Default)]
struct RouterState {
    breakers: HashMap<String, Breaker>,
    /// Moving average of recent latency (ms) per model: total time, or time to first token.
    latency_ms: HashMap<String, f64>,
    /// Round-robin position per tenant and alias.
    rotation: HashMap<String, u64>,
    /// Smooth weighted round-robin state per tenant and alias.
    weighted: HashMap<String, Vec<i64>>,
}

fn tracked<'a, V: Default>(map: &'a mut HashMap<String, V>, key: &str) -> Option<&'a mut V> {
    if !map.contains_key(key) {
        if map.len() >= MAX_TRACKED {
            return None;
        }
        map.insert(key.to_string(), V::default());
    }
    map.get_mut(key)
}

pub struct Router {
    registry: Arc<Registry>,
    config: RouterConfig,
    state: Mutex<RouterState>,
}

impl Router {
    pub fn new(registry: Arc<Registry>, config: RouterConfig) -> Router {
        Router {
            registry,
            config,
            state: Mutex::new(RouterState::default()),
        }
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    fn state(&self) -> MutexGuard<'_, RouterState> {
        // The state holds counters only; one poisoned by a panic elsewhere is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The order in which the chain's models are tried for one request: the strategy orders
    /// the alias's own models, then the template fallbacks follow. `scope` keeps rotation
    /// state apart per tenant.
    pub fn plan(&self, scope: &str, chain: &Chain) -> Vec<usize> {
        let routed = chain.routed.min(chain.models.len());
        let mut order: Vec<usize> = (0..routed).collect();
        if routed > 1 {
            let key = format!("{scope}\u{1f}{}", chain.alias.as_deref().unwrap_or(""));
            let mut state = self.state();
            match chain.strategy {
                Strategy::Sequential => {}
                Strategy::RoundRobin => {
                    if let Some(counter) = tracked(&mut state.rotation, &key) {
                        let start = usize::try_from(*counter % routed as u64).unwrap_or(0);
                        *counter = counter.wrapping_add(1);
                        order.rotate_left(start);
                    }
                }
                Strategy::Weighted => {
                    let weights = chain.weights.as_deref().unwrap_or(&[]);
                    if weights.len() == routed
                        && let Some(current) = tracked(&mut state.weighted, &key)
                        && let Some(first) = smooth_weighted_pick(current, weights)
                    {
                        order.retain(|i| *i != first);
                        order.insert(0, first);
                    }
                }
                Strategy::LeastLatency => {
                    let latency = |i: &usize| {
                        state
                            .latency_ms
                            .get(&chain.models[*i].to_string())
                            .copied()
                            // Unmeasured models go first so that they get measured.
                            .unwrap_or(0.0)
                    };
                    order.sort_by(|a, b| latency(a).total_cmp(&latency(b)).then(a.cmp(b)));
                }
            }
        }
        order.extend(routed..chain.models.len());
        order
    }

    /// Whether the model's breaker lets a request through now.
    pub(crate) fn admit(&self, model: &str) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        match state.breakers.get_mut(model) {
            Some(breaker) => breaker.admit(now, &self.config.breaker),
            None => true,
        }
    }

    /// When a skipped model admits requests again.
    pub(crate) fn reopens_at(&self, model: &str) -> Option<Instant> {
        self.state()
            .breakers
            .get(model)
            .and_then(Breaker::reopens_at)
    }

    /// Whether the model is being skipped (open, or half-open with a probe in flight).
    pub fn is_open(&self, model: &str) -> bool {
        let now = Instant::now();
        self.state()
            .breakers
            .get(model)
            .is_some_and(|b| b.is_open(now))
    }

    pub(crate) fn record_success(&self, model: &str, latency: Duration) {
        let mut state = self.state();
        if let Some(breaker) = state.breakers.get_mut(model) {
            breaker.success();
        }
        let sample = latency.as_secs_f64() * 1000.0;
        if let Some(average) = tracked(&mut state.latency_ms, model) {
            *average = if *average == 0.0 {
                sample
            } else {
                LATENCY_ALPHA * sample + (1.0 - LATENCY_ALPHA) * *average
            };
        }
    }

    /// Counts a retryable failure against the model's breaker.
    pub(crate) fn record_failure(&self, model: &str) {
        let now = Instant::now();
        let config = self.config.breaker;
        let mut state = self.state();
        if let Some(breaker) = tracked(&mut state.breakers, model) {
            breaker.failure(now, &config);
        }
    }
}

/// Nginx's smooth weighted round-robin: exact proportions over every `sum(weights)` picks, and
/// the heavy model's turns spread out rather than bunched.
fn smooth_weighted_pick(current: &mut Vec<i64>, weights: &[u32]) -> Option<usize> {
    if current.len() != weights.len() {
        *current = vec![0; weights.len()];
    }
    let total: i64 = weights.iter().map(|w| i64::from(*w)).sum();
    if total == 0 {
        return None;
    }
    for (c, w) in current.iter_mut().zip(weights) {
        *c += i64::from(*w);
    }
    let (best, _) = current
        .iter()
        .enumerate()
        .max_by(|(i, a), (j, b)| a.cmp(b).then(j.cmp(i)))?;
    current[best] -= total;
    Some(best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Catalogue, ProvidersConfig};

    fn router() -> Router {
        let registry = Registry::from_config(
            &ProvidersConfig::new(),
            Arc::new(Catalogue::shipped().unwrap()),
        )
        .unwrap();
        Router::new(
            Arc::new(registry),
            RouterConfig {
                breaker: BreakerConfig {
                    threshold: 2,
                    cooldown: Duration::from_secs(60),
                },
            },
        )
    }

    fn chain(strategy: Strategy, routed: usize, total: usize, weights: Option<Vec<u32>>) -> Chain {
        Chain {
            requested: "alias".into(),
            models: (0..total)
                .map(|i| ChainModel {
                    provider: "openai".into(),
                    model: format!("m{i}"),
                })
                .collect(),
            strategy,
            weights,
            alias: Some("alias".into()),
            routed,
        }
    }

    #[test]
    fn round_robin_rotates_the_start_and_keeps_fallbacks_last() {
        let router = router();
        let chain = chain(Strategy::RoundRobin, 3, 4, None);
        let plans: Vec<Vec<usize>> = (0..4).map(|_| router.plan("t1", &chain)).collect();
        assert_eq!(
            plans,
            [
                vec![0, 1, 2, 3],
                vec![1, 2, 0, 3],
                vec![2, 0, 1, 3],
                vec![0, 1, 2, 3]
            ]
        );
        // Another tenant has its own rotation.
        assert_eq!(router.plan("t2", &chain), vec![0, 1, 2, 3]);
    }

    #[test]
    fn weighted_picks_in_proportion_and_interleaves() {
        let router = router();
        let chain = chain(Strategy::Weighted, 3, 3, Some(vec![5, 1, 1]));
        let firsts: Vec<usize> = (0..7).map(|_| router.plan("t", &chain)[0]).collect();
        assert_eq!(firsts.iter().filter(|f| **f == 0).count(), 5);
        assert_eq!(firsts.iter().filter(|f| **f == 1).count(), 1);
        assert_eq!(firsts.iter().filter(|f| **f == 2).count(), 1);
        // Nginx's own example: the light models' turns fall between the heavy one's.
        assert_eq!(firsts, [0, 0, 1, 0, 2, 0, 0]);
        let plan = router.plan("t", &chain);
        let mut sorted = plan.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            vec![0, 1, 2],
            "every model stays in the plan as a fallback"
        );
    }

    #[test]
    fn least_latency_prefers_the_fastest_and_measures_the_unknown_first() {
        let router = router();
        let chain = chain(Strategy::LeastLatency, 3, 3, None);
        router.record_success("openai/m0", Duration::from_millis(300));
        router.record_success("openai/m1", Duration::from_millis(100));
        assert_eq!(router.plan("t", &chain), vec![2, 1, 0]);
        router.record_success("openai/m2", Duration::from_millis(900));
        assert_eq!(router.plan("t", &chain), vec![1, 0, 2]);
        // A slow spell moves the average, not just the last sample.
        router.record_success("openai/m1", Duration::from_millis(1000));
        assert_eq!(router.plan("t", &chain), vec![0, 1, 2]);
    }

    #[test]
    fn breakers_open_after_consecutive_failures_only() {
        let router = router();
        router.record_failure("openai/m0");
        router.record_success("openai/m0", Duration::from_millis(5));
        router.record_failure("openai/m0");
        assert!(router.admit("openai/m0"), "a success resets the count");
        router.record_failure("openai/m0");
        assert!(!router.admit("openai/m0"));
        assert!(router.is_open("openai/m0"));
        assert!(router.reopens_at("openai/m0").is_some());
        assert!(router.admit("openai/m1"));
    }
}
