//! Open event streams per tenant (`limits.max_streams_per_tenant`): a stream takes a slot before
//! its response starts and gives it back when it ends or the client disconnects (the response
//! body, which holds the slot, is dropped then). Per instance, like the other limits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use baton_domain::TenantId;
use futures::{Stream, StreamExt};

use crate::error::ApiError;

/// What a client refused a stream is told to wait: streams are long, but slots free up as they
/// end, so a short retry is worth it.
const RETRY_AFTER: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct StreamSlots {
    max: usize,
    open: Arc<Mutex<HashMap<TenantId, usize>>>,
}

/// One open stream's slot; dropping it frees the slot.
pub struct StreamSlot {
    tenant: TenantId,
    open: Arc<Mutex<HashMap<TenantId, usize>>>,
}

impl StreamSlots {
    pub fn new(max: usize) -> StreamSlots {
        StreamSlots {
            max,
            open: Arc::default(),
        }
    }

    /// A slot for one more stream of `tenant`, or 429 `RATE_LIMITED` with `Retry-After`.
    pub fn acquire(&self, tenant: &TenantId) -> Result<StreamSlot, ApiError> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(tenant.clone()).or_insert(0);
        if *count >= self.max {
            tracing::info!(%tenant, open = *count, "stream refused: the tenant's open stream limit is reached");
            return Err(ApiError::RateLimited {
                retry_after: RETRY_AFTER,
            });
        }
        *count += 1;
        Ok(StreamSlot {
            tenant: tenant.clone(),
            open: self.open.clone(),
        })
    }

    /// Streams `tenant` has open now.
    pub fn open(&self, tenant: &TenantId) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(tenant).copied().unwrap_or(0)
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.tenant);
            }
        }
    }
}

/// `events`, holding `slot` until the stream is done or dropped.
pub fn holding<S, T>(slot: StreamSlot, events: S) -> impl Stream<Item = T> + Send
where
    S: Stream<Item = T> + Send,
    T: Send,
{
    let mut slot = Some(slot);
    events
        .map(Some)
        .chain(futures::stream::once(async { None }))
        .filter_map(move |item| {
            if item.is_none() {
                // The last event is out: the slot is free before the connection closes.
                slot.take();
            }
            futures::future::ready(item)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_counted_per_tenant_and_freed_on_drop() {
        let slots = StreamSlots::new(2);
        let a = TenantId::new("a");
        let b = TenantId::new("b");
        let first = slots.acquire(&a).unwrap();
        let _second = slots.acquire(&a).unwrap();
        let refused = slots.acquire(&a).err().unwrap();
        assert_eq!(refused.code(), "RATE_LIMITED");
        assert!(
            slots.acquire(&b).is_ok(),
            "another tenant has its own slots"
        );
        drop(first);
        assert_eq!(slots.open(&a), 1);
        assert!(slots.acquire(&a).is_ok());
    }
}
