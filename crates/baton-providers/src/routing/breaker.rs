//! A per-model circuit breaker: after `threshold` consecutive retryable failures the model is
//! skipped for `cooldown`; then one probe request is let through (half-open). A success closes
//! the breaker, a failure opens it again.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    pub threshold: u32,
    pub cooldown: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            threshold: 5,
            cooldown: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Breaker {
    consecutive_failures: u32,
    open_until: Option<Instant>,
    /// When the half-open probe was let through; other requests skip the model meanwhile.
    probe_since: Option<Instant>,
}

impl Breaker {
    /// Whether a request may go to the model now. Past the cooldown the first caller becomes the
    /// probe; a probe that never reports (its request was cancelled) is replaced after another
    /// cooldown.
    pub(crate) fn admit(&mut self, now: Instant, config: &BreakerConfig) -> bool {
        let Some(until) = self.open_until else {
            return true;
        };
        if now < until {
            return false;
        }
        match self.probe_since {
            Some(since) if now.duration_since(since) < config.cooldown => false,
            _ => {
                self.probe_since = Some(now);
                true
            }
        }
    }

    /// When the model will next admit a request (`None`: now).
    pub(crate) fn reopens_at(&self) -> Option<Instant> {
        self.open_until
    }

    pub(crate) fn is_open(&self, now: Instant) -> bool {
        self.open_until.is_some_and(|until| now < until) || self.probe_since.is_some()
    }

    pub(crate) fn success(&mut self) {
        *self = Breaker::default();
    }

    /// Counts a retryable failure.
    pub(crate) fn failure(&mut self, now: Instant, config: &BreakerConfig) {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        if self.probe_since.is_some() || self.consecutive_failures >= config.threshold {
            self.open_until = Some(now + config.cooldown);
            self.probe_since = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_the_threshold_and_probes_after_the_cooldown() {
        let config = BreakerConfig {
            threshold: 3,
            cooldown: Duration::from_secs(10),
        };
        let t0 = Instant::now();
        let mut breaker = Breaker::default();
        for _ in 0..2 {
            breaker.failure(t0, &config);
            assert!(
                breaker.admit(t0, &config),
                "still closed below the threshold"
            );
        }
        breaker.failure(t0, &config);
        assert!(!breaker.admit(t0 + Duration::from_secs(9), &config));
        let later = t0 + Duration::from_secs(10);
        assert!(breaker.admit(later, &config), "the probe goes through");
        assert!(!breaker.admit(later, &config), "only one probe at a time");
        // The probe fails: open again for a full cooldown.
        breaker.failure(later, &config);
        assert!(!breaker.admit(later + Duration::from_secs(5), &config));
        let again = later + Duration::from_secs(10);
        assert!(breaker.admit(again, &config));
        breaker.success();
        assert!(breaker.admit(again, &config));
        assert!(
            breaker.admit(again, &config),
            "closed after a successful probe"
        );
    }

    #[test]
    fn a_lost_probe_is_replaced() {
        let config = BreakerConfig {
            threshold: 1,
            cooldown: Duration::from_secs(10),
        };
        let t0 = Instant::now();
        let mut breaker = Breaker::default();
        breaker.failure(t0, &config);
        let probe = t0 + Duration::from_secs(10);
        assert!(breaker.admit(probe, &config));
        assert!(!breaker.admit(probe + Duration::from_secs(9), &config));
        assert!(breaker.admit(probe + Duration::from_secs(10), &config));
    }
}
