//! The opt-in response cache (tenant setting `responseCacheTtlSeconds`, 0 = off). Keyed on the
//! tenant, the model name the client asked for and the whole canonical request including
//! `x_nonce`, so a client busts it by changing the nonce. Per instance, bounded by size.

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_domain::TenantId;
use baton_domain::chat::{InferenceRequest, InferenceResponse, StreamDelta};
use baton_providers::DeltaStream;
use baton_providers::routing::ChainModel;
use moka::Expiry;
use moka::future::Cache;
use sha2::{Digest, Sha256};

/// A cached answer and the model that gave it.
pub struct CachedAnswer {
    pub response: InferenceResponse,
    pub model: ChainModel,
    ttl: Duration,
}

/// Where one request's answer is (or will be) kept.
#[derive(Clone)]
pub struct CacheSlot {
    key: [u8; 32],
    ttl: Duration,
}

struct PerEntryTtl;

impl Expiry<[u8; 32], Arc<CachedAnswer>> for PerEntryTtl {
    fn expire_after_create(
        &self,
        _key: &[u8; 32],
        value: &Arc<CachedAnswer>,
        _created_at: Instant,
    ) -> Option<Duration> {
        Some(value.ttl)
    }
}

#[derive(Clone)]
pub struct ResponseCache {
    entries: Cache<[u8; 32], Arc<CachedAnswer>>,
}

fn weight(answer: &CachedAnswer) -> u32 {
    let response = &answer.response;
    let bytes = response.text.len()
        + response
            .tool_calls
            .iter()
            .map(|c| c.name.len() + c.arguments.len() + c.id.len())
            .sum::<usize>()
        + response
            .citations
            .iter()
            .map(|c| c.url.len() + c.title.as_ref().map_or(0, String::len))
            .sum::<usize>()
        + 256;
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

impl ResponseCache {
    pub fn new(max_bytes: u64) -> ResponseCache {
        ResponseCache {
            entries: Cache::builder()
                .max_capacity(max_bytes)
                .weigher(|_key, value: &Arc<CachedAnswer>| weight(value))
                .expire_after(PerEntryTtl)
                .build(),
        }
    }

    /// The slot of a request, when the tenant's cache is on.
    pub fn slot(
        tenant: &TenantId,
        requested_model: &str,
        request: &InferenceRequest,
        nonce: Option<&str>,
        ttl_seconds: u64,
    ) -> Option<CacheSlot> {
        if ttl_seconds == 0 {
            return None;
        }
        let mut hash = Sha256::new();
        // Each part is length-prefixed so that no two different requests hash alike.
        for part in [
            tenant.as_str().as_bytes(),
            requested_model.as_bytes(),
            nonce.unwrap_or("").as_bytes(),
        ] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part);
        }
        let body = serde_json::to_vec(request).ok()?;
        hash.update(body);
        Some(CacheSlot {
            key: hash.finalize().into(),
            ttl: Duration::from_secs(ttl_seconds),
        })
    }

    pub async fn get(&self, slot: &CacheSlot) -> Option<Arc<CachedAnswer>> {
        self.entries.get(&slot.key).await
    }

    pub async fn put(&self, slot: &CacheSlot, model: ChainModel, response: InferenceResponse) {
        let answer = Arc::new(CachedAnswer {
            response,
            model,
            ttl: slot.ttl,
        });
        self.entries.insert(slot.key, answer).await;
    }
}

/// Stores a streamed answer once the stream has ended well.
pub struct CacheFill {
    pub cache: ResponseCache,
    pub slot: CacheSlot,
    pub model: ChainModel,
}

impl CacheFill {
    pub async fn fill(self, response: InferenceResponse) {
        self.cache.put(&self.slot, self.model, response).await;
    }
}

/// A cached answer replayed as the deltas a stream would have carried.
pub fn replay(response: &InferenceResponse) -> DeltaStream {
    let mut deltas = Vec::new();
    if !response.model.is_empty() {
        deltas.push(StreamDelta::Model(response.model.clone()));
    }
    if !response.text.is_empty() {
        deltas.push(StreamDelta::Text(response.text.clone()));
    }
    if let Some(refusal) = &response.refusal {
        deltas.push(StreamDelta::Refusal(refusal.clone()));
    }
    for (index, call) in response.tool_calls.iter().enumerate() {
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        deltas.push(StreamDelta::ToolCallStart {
            index,
            id: call.id.clone(),
            name: call.name.clone(),
        });
        deltas.push(StreamDelta::ToolCallArguments {
            index,
            fragment: call.arguments.clone(),
        });
    }
    deltas.extend(
        response
            .citations
            .iter()
            .cloned()
            .map(StreamDelta::Citation),
    );
    deltas.push(StreamDelta::Usage(response.usage));
    deltas.push(StreamDelta::Finish(response.finish_reason));
    Box::pin(futures::stream::iter(deltas.into_iter().map(Ok)))
}

#[cfg(test)]
mod tests {
    use baton_domain::chat::{Message, Role, Usage};
    use futures::StreamExt;

    use super::*;

    fn request(text: &str) -> InferenceRequest {
        InferenceRequest {
            messages: vec![Message::text(Role::User, text)],
            ..InferenceRequest::default()
        }
    }

    #[tokio::test]
    async fn keys_cover_tenant_model_request_and_nonce() {
        let t1 = TenantId::new("t1");
        let t2 = TenantId::new("t2");
        let slot = |tenant: &TenantId, model: &str, text: &str, nonce: Option<&str>| {
            ResponseCache::slot(tenant, model, &request(text), nonce, 60)
                .unwrap()
                .key
        };
        let base = slot(&t1, "m", "hi", None);
        assert_eq!(base, slot(&t1, "m", "hi", None));
        assert_ne!(base, slot(&t2, "m", "hi", None));
        assert_ne!(base, slot(&t1, "n", "hi", None));
        assert_ne!(base, slot(&t1, "m", "hi!", None));
        assert_ne!(base, slot(&t1, "m", "hi", Some("1")));
        assert!(ResponseCache::slot(&t1, "m", &request("hi"), None, 0).is_none());
    }

    #[tokio::test]
    async fn entries_expire_after_their_ttl_and_replay_as_a_stream() {
        let cache = ResponseCache::new(1 << 20);
        let tenant = TenantId::new("t");
        let mut slot = ResponseCache::slot(&tenant, "m", &request("hi"), None, 60).unwrap();
        slot.ttl = Duration::from_millis(50);
        let response = InferenceResponse {
            text: "cached".into(),
            usage: Usage {
                tokens_in: 3,
                tokens_out: 1,
                ..Usage::default()
            },
            ..InferenceResponse::default()
        };
        let model = ChainModel {
            provider: "openai".into(),
            model: "m".into(),
        };
        cache.put(&slot, model, response.clone()).await;
        let hit = cache.get(&slot).await.unwrap();
        assert_eq!(hit.response, response);

        let mut accumulator = baton_domain::chat::ResponseAccumulator::new("m".to_string());
        let mut stream = replay(&hit.response);
        while let Some(delta) = stream.next().await {
            accumulator.push(&delta.unwrap());
        }
        let replayed = accumulator.snapshot();
        assert_eq!(
            (replayed.text.as_str(), replayed.usage),
            ("cached", response.usage)
        );

        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(cache.get(&slot).await.is_none(), "expired");
    }
}
