//! The per-request mapping and parsing of each wire format, without HTTP, for the criterion
//! benchmarks in `benches/`. Not a stable API (hidden from the docs): each function is a thin
//! wrapper over the code the provider itself runs, so a benchmark measures the real path.

use baton_domain::chat::{InferenceRequest, InferenceResponse};
use bytes::Bytes;
use futures::{Stream, StreamExt};

use crate::error::{ProviderError, ProviderResult};
use crate::openai::Flavor;
use crate::provider::DeltaStream;
use crate::{anthropic, bedrock, gemini, http, openai, openai_responses};

/// One wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    OpenAiChat,
    OpenAiResponses,
    Anthropic,
    Gemini,
    Bedrock,
}

impl Format {
    pub const ALL: [Format; 5] = [
        Format::OpenAiChat,
        Format::OpenAiResponses,
        Format::Anthropic,
        Format::Gemini,
        Format::Bedrock,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Format::OpenAiChat => "openai_chat",
            Format::OpenAiResponses => "openai_responses",
            Format::Anthropic => "anthropic",
            Format::Gemini => "gemini",
            Format::Bedrock => "bedrock",
        }
    }
}

const PROVIDER: &str = "bench";

fn encode(value: &impl serde::Serialize) -> ProviderResult<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| ProviderError::InvalidResponse {
        provider: PROVIDER.into(),
        message: format!("could not encode the request: {e}"),
    })
}

/// The request body as sent: the canonical request mapped to the wire and serialised.
pub fn request_body(
    format: Format,
    request: &InferenceRequest,
    stream: bool,
) -> ProviderResult<Vec<u8>> {
    match format {
        Format::OpenAiChat => encode(&openai::to_wire(request, &Flavor::OpenAi, stream)),
        Format::OpenAiResponses => encode(&openai_responses::to_wire(PROVIDER, request, stream)?),
        Format::Anthropic => encode(&anthropic::to_wire(
            request,
            stream,
            anthropic::DEFAULT_MAX_TOKENS,
        )),
        Format::Gemini => {
            let wire = gemini::to_wire(request).map_err(|what| ProviderError::Unsupported {
                field: None,
                provider: PROVIDER.into(),
                what,
            })?;
            encode(&wire)
        }
        Format::Bedrock => encode(&bedrock::to_wire(
            PROVIDER,
            request,
            bedrock::DEFAULT_MAX_TOKENS,
        )?),
    }
}

/// A non-streaming answer body decoded and mapped to the canonical response.
pub fn parse_response(
    format: Format,
    body: &[u8],
    request: &InferenceRequest,
) -> ProviderResult<InferenceResponse> {
    let model = &request.model;
    match format {
        Format::OpenAiChat => Ok(openai::from_wire(http::decode(PROVIDER, body)?, model)),
        Format::OpenAiResponses => {
            openai_responses::from_wire(PROVIDER, http::decode(PROVIDER, body)?, model)
        }
        Format::Anthropic => Ok(anthropic::from_wire(
            http::decode(PROVIDER, body)?,
            anthropic::structured(request),
        )),
        Format::Gemini => gemini::answer(PROVIDER, http::decode(PROVIDER, body)?, model),
        Format::Bedrock => Ok(bedrock::from_wire(
            http::decode(PROVIDER, body)?,
            model,
            bedrock::structured(request),
        )),
    }
}

/// The canonical deltas of a streamed body arriving as `bytes`.
pub fn parse_stream<S, E>(format: Format, bytes: S, request: &InferenceRequest) -> DeltaStream
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    match format {
        Format::OpenAiChat => openai::deltas(PROVIDER, bytes),
        Format::OpenAiResponses => openai_responses::deltas(PROVIDER, bytes),
        Format::Anthropic => anthropic::deltas(PROVIDER, bytes, anthropic::structured(request)),
        Format::Gemini => gemini::deltas(PROVIDER, bytes),
        Format::Bedrock => {
            let bytes = bytes.map(|chunk| {
                chunk.map_err(|e| ProviderError::Connection {
                    provider: PROVIDER.into(),
                    message: e.to_string(),
                })
            });
            bedrock::deltas(
                PROVIDER,
                bytes,
                bedrock::structured(request),
                bedrock::MAX_FRAME_BYTES,
            )
        }
    }
}
