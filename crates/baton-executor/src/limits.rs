//! Per-tenant request rate limits (tenant setting `requestsPerMinute`) on the endpoints that
//! call models. Per instance, like every cache (DESIGN.md "Scale").

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use baton_domain::TenantId;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use moka::future::Cache;

use crate::error::{ExecutorError, ExecutorResult};

struct TenantLimiter {
    per_minute: u32,
    limiter: DefaultDirectRateLimiter,
}

#[derive(Clone)]
pub struct TenantLimiters {
    limiters: Cache<String, Arc<TenantLimiter>>,
}

impl Default for TenantLimiters {
    fn default() -> Self {
        Self::new()
    }
}

impl TenantLimiters {
    pub fn new() -> TenantLimiters {
        TenantLimiters {
            // Idle tenants' buckets are full anyway: forgetting them loses nothing.
            limiters: Cache::builder()
                .max_capacity(100_000)
                .time_to_idle(Duration::from_secs(300))
                .build(),
        }
    }

    /// Takes one request from the tenant's budget, or 429 with the time until the next one.
    pub async fn check(&self, tenant: &TenantId, per_minute: Option<u32>) -> ExecutorResult<()> {
        let Some(limit) = per_minute.and_then(NonZeroU32::new) else {
            return Ok(());
        };
        let mut entry = self
            .limiters
            .get_with_by_ref(tenant.as_str(), async { new_limiter(limit) })
            .await;
        if entry.per_minute != limit.get() {
            // The setting changed: start a bucket at the new rate.
            entry = new_limiter(limit);
            self.limiters
                .insert(tenant.as_str().to_string(), entry.clone())
                .await;
        }
        entry
            .limiter
            .check()
            .map_err(|not_until| ExecutorError::RateLimited {
                retry_after: not_until.wait_time_from(DefaultClock::default().now()),
            })
    }
}

fn new_limiter(limit: NonZeroU32) -> Arc<TenantLimiter> {
    Arc::new(TenantLimiter {
        per_minute: limit.get(),
        limiter: RateLimiter::direct(Quota::per_minute(limit)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_tenant_has_its_own_budget_at_its_own_rate() {
        let limiters = TenantLimiters::new();
        let (a, b) = (TenantId::new("a"), TenantId::new("b"));
        for _ in 0..3 {
            limiters.check(&a, Some(3)).await.unwrap();
        }
        let err = limiters.check(&a, Some(3)).await.unwrap_err();
        assert!(
            matches!(err, ExecutorError::RateLimited { retry_after } if retry_after > Duration::ZERO)
        );
        limiters.check(&b, Some(3)).await.unwrap();
        limiters.check(&a, None).await.unwrap();
        // A raised limit takes effect at once.
        limiters.check(&a, Some(10)).await.unwrap();
    }
}
