use std::pin::Pin;

use async_trait::async_trait;
use baton_domain::chat::{InferenceRequest, InferenceResponse, StreamDelta};
use futures::{Stream, StreamExt};

use crate::error::{ProviderError, ProviderResult};

/// Canonical deltas of a streamed response. Dropping the stream closes the upstream connection.
pub type DeltaStream = Pin<Box<dyn Stream<Item = ProviderResult<StreamDelta>> + Send>>;

/// One provider. Implementations map the canonical request to their wire format and back.
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// The provider key clients use (`openai`, `anthropic`, ...).
    fn key(&self) -> &str;

    /// Whether the provider takes images by URL; one that takes only inline bytes is sent
    /// requests whose image URLs the engine fetched first.
    fn takes_image_urls(&self) -> bool {
        true
    }

    async fn infer(&self, request: &InferenceRequest) -> ProviderResult<InferenceResponse>;

    async fn infer_stream(&self, request: &InferenceRequest) -> ProviderResult<DeltaStream>;
}

/// Anthropic, Bedrock's Converse and Gemini refuse a conversation without a user turn, which
/// OpenAI answers: a request of system text only (a flow template without a `userTemplate`) is
/// sent to them as that text in one user turn. `None`: the request has a turn of its own.
pub(crate) fn system_only_as_user(request: &InferenceRequest) -> Option<InferenceRequest> {
    use baton_domain::chat::{Message, Role};
    let only_system =
        !request.messages.is_empty() && request.messages.iter().all(|m| m.role == Role::System);
    only_system.then(|| {
        let text: Vec<String> = request.messages.iter().map(Message::joined_text).collect();
        InferenceRequest {
            messages: vec![Message::text(Role::User, text.join("\n\n"))],
            ..request.clone()
        }
    })
}

/// A tool-use content block of a stream (Anthropic's and Bedrock's, which stream a call's
/// input in pieces after its start).
#[derive(Debug)]
pub(crate) struct ToolBlock {
    /// The tool call's ordinal; `None` for the structured-output tool.
    ordinal: Option<u32>,
    /// Some of its input arrived.
    has_input: bool,
}

impl ToolBlock {
    pub(crate) fn new(ordinal: Option<u32>) -> ToolBlock {
        ToolBlock {
            ordinal,
            has_input: false,
        }
    }

    /// A piece of its input: the call's arguments, or the answer's text for the
    /// structured-output tool.
    pub(crate) fn input(&mut self, fragment: String) -> StreamDelta {
        self.has_input |= !fragment.is_empty();
        match self.ordinal {
            Some(index) => StreamDelta::ToolCallArguments { index, fragment },
            None => StreamDelta::Text(fragment),
        }
    }

    /// The block's end: a call that streamed no input has the arguments `{}`, as a complete
    /// answer's have (clients parse them as JSON).
    pub(crate) fn close(&mut self) -> Option<StreamDelta> {
        (!self.has_input).then(|| self.input("{}".into()))
    }
}

/// The thinking budget to send where a provider counts thinking inside the answer's token cap
/// (Anthropic, Bedrock's Claude, Gemini): the caller's `max_tokens` is never raised, so a budget
/// that does not fit shrinks to leave the answer one token, and thinking is off when the cap
/// cannot hold the provider's `minimum` budget.
pub(crate) fn thinking_under_cap(budget: u32, cap: Option<u32>, minimum: u32) -> Option<u32> {
    match cap {
        Some(cap) if budget < cap => Some(budget),
        Some(cap) if cap <= minimum => None,
        Some(cap) => Some(cap - 1),
        None => Some(budget),
    }
}

/// Ends `deltas` with an error when the upstream closes the body before the stream's finish
/// event: a clean end part-way through an answer is a failure, not a short answer billed at
/// whatever usage had arrived (usually none). An end before any delta is a connection failure,
/// retryable: nothing reached the client, so the chain can still try the next model.
pub fn require_finish(provider: &str, deltas: DeltaStream) -> DeltaStream {
    struct Watch {
        inner: DeltaStream,
        provider: String,
        /// A finish event or an error was seen: the end of the body is expected.
        settled: bool,
        /// A delta went out: the stream is committed to its model.
        yielded: bool,
        done: bool,
    }
    let watch = Watch {
        inner: deltas,
        provider: provider.to_string(),
        settled: false,
        yielded: false,
        done: false,
    };
    Box::pin(futures::stream::unfold(watch, |mut watch| async move {
        if watch.done {
            return None;
        }
        match watch.inner.next().await {
            Some(item) => {
                if matches!(item, Ok(StreamDelta::Finish(_)) | Err(_)) {
                    watch.settled = true;
                }
                watch.yielded |= item.is_ok();
                Some((item, watch))
            }
            None if watch.settled => None,
            None => {
                watch.done = true;
                let provider = std::mem::take(&mut watch.provider);
                let error = if watch.yielded {
                    ProviderError::InvalidResponse {
                        provider,
                        message: "the stream ended before its final event".into(),
                    }
                } else {
                    ProviderError::Connection {
                        provider,
                        message: "the response ended before the answer began".into(),
                    }
                };
                Some((Err(error), watch))
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_domain::chat::FinishReason;

    async fn collect(items: Vec<ProviderResult<StreamDelta>>) -> Vec<ProviderResult<StreamDelta>> {
        require_finish("p", Box::pin(futures::stream::iter(items)))
            .collect()
            .await
    }

    #[test]
    fn a_system_only_conversation_reaches_every_provider_as_a_user_turn() {
        use baton_domain::chat::{Message, Role};
        let request = InferenceRequest {
            model: "m".into(),
            messages: vec![
                Message::text(Role::System, "Write a haiku."),
                Message::text(Role::System, "About cats."),
            ],
            ..InferenceRequest::default()
        };
        let anthropic = serde_json::to_value(crate::anthropic::to_wire(&request, false, 1024));
        let anthropic = anthropic.unwrap();
        assert_eq!(anthropic["messages"][0]["role"], "user", "{anthropic}");
        let text = &anthropic["messages"][0]["content"][0]["text"];
        assert_eq!(text, "Write a haiku.\n\nAbout cats.");
        assert!(anthropic.get("system").is_none());
        let bedrock = crate::bedrock::to_wire("bedrock", &request, 1024).unwrap();
        let bedrock = serde_json::to_value(bedrock).unwrap();
        assert_eq!(bedrock["messages"][0]["role"], "user", "{bedrock}");
        let gemini = serde_json::to_value(crate::gemini::to_wire(&request).unwrap()).unwrap();
        assert_eq!(gemini["contents"][0]["role"], "user", "{gemini}");
        // A conversation with a turn of its own keeps its system prompt apart.
        let mut asked = request.clone();
        asked.messages.push(Message::text(Role::User, "Now."));
        assert!(system_only_as_user(&asked).is_none());
    }

    #[tokio::test]
    async fn a_stream_that_finishes_passes_unchanged() {
        let items = vec![
            Ok(StreamDelta::Text("hi".into())),
            Ok(StreamDelta::Finish(FinishReason::Stop)),
            Ok(StreamDelta::Usage(Default::default())),
        ];
        let out = collect(items).await;
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(Result::is_ok));
    }

    #[tokio::test]
    async fn a_stream_cut_before_its_finish_ends_with_an_error() {
        let out = collect(vec![Ok(StreamDelta::Text("half an ans".into()))]).await;
        assert_eq!(out.len(), 2);
        match &out[1] {
            Err(ProviderError::InvalidResponse { provider, message }) => {
                assert_eq!(provider, "p");
                assert!(message.contains("ended before"), "{message}");
            }
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_upstream_error_is_not_followed_by_a_second_one() {
        let error = ProviderError::InvalidResponse {
            provider: "p".into(),
            message: "broken".into(),
        };
        let out = collect(vec![Ok(StreamDelta::Text("a".into())), Err(error)]).await;
        assert_eq!(out.len(), 2);
    }

    /// A body that ends cleanly before any delta broke off before the answer began: retryable,
    /// so the chain tries the next model (nothing reached the client).
    #[tokio::test]
    async fn a_stream_that_ends_before_any_delta_is_retryable() {
        let out = collect(Vec::new()).await;
        match &out[..] {
            [Err(error @ ProviderError::Connection { provider, .. })] => {
                assert_eq!(provider, "p");
                assert!(error.is_retryable());
            }
            other => panic!("expected a connection error, got {other:?}"),
        }
    }
}
