use std::pin::Pin;

use async_trait::async_trait;
use baton_domain::chat::{InferenceRequest, InferenceResponse, StreamDelta};
use futures::Stream;

use crate::error::ProviderResult;

/// Canonical deltas of a streamed response. Dropping the stream closes the upstream connection.
pub type DeltaStream = Pin<Box<dyn Stream<Item = ProviderResult<StreamDelta>> + Send>>;

/// One provider. Implementations map the canonical request to their wire format and back.
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// The provider key clients use (`openai`, `anthropic`, ...).
    fn key(&self) -> &str;

    async fn infer(&self, request: &InferenceRequest) -> ProviderResult<InferenceResponse>;

    async fn infer_stream(&self, request: &InferenceRequest) -> ProviderResult<DeltaStream>;
}
