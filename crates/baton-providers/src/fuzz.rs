//! The stream parsers' invariants, shared by the fuzz targets (`fuzz/`) and the property tests.
//! Not an API: compiled for tests and with the `fuzzing` feature only. A check returns the
//! invariant it found broken; a panic (or an allocation the fuzzer's memory limit stops) is the
//! other failure.

use std::convert::Infallible;

use baton_domain::chat::{InferenceRequest, ResponseAccumulator, ResponseFormat, StreamDelta};
use bytes::Bytes;
use futures::StreamExt;

use crate::bench::{Format, parse_stream};
use crate::sse;

pub type Check = Result<(), String>;

/// `body` cut at `cuts` (offsets, taken modulo the length, in any order).
fn chunks(body: &[u8], cuts: &[usize]) -> Vec<Bytes> {
    let mut at: Vec<usize> = cuts.iter().map(|cut| cut % (body.len() + 1)).collect();
    at.push(0);
    at.push(body.len());
    at.sort_unstable();
    at.dedup();
    at.windows(2)
        .map(|w| Bytes::copy_from_slice(&body[w[0]..w[1]]))
        .collect()
}

fn source(chunks: Vec<Bytes>) -> impl futures::Stream<Item = Result<Bytes, Infallible>> {
    futures::stream::iter(chunks.into_iter().map(Ok))
}

/// Every delta and error the parser yields, in order, as text (errors have no `PartialEq`).
fn parse(format: Format, chunks: Vec<Bytes>, structured: bool) -> Vec<Result<StreamDelta, String>> {
    let request = InferenceRequest {
        response_format: structured.then_some(ResponseFormat::JsonObject),
        ..InferenceRequest::default()
    };
    let items = parse_stream(format, source(chunks), &request).collect::<Vec<_>>();
    futures::executor::block_on(items)
        .into_iter()
        .map(|item| item.map_err(|error| error.to_string()))
        .collect()
}

/// One provider's stream parser on any body: the deltas do not depend on how the body was cut
/// into chunks (the network decides that), and they fold into a response.
pub fn stream(format: Format, body: &[u8], cuts: &[usize], structured: bool) -> Check {
    let whole = parse(format, vec![Bytes::copy_from_slice(body)], structured);
    let split = parse(format, chunks(body, cuts), structured);
    if whole != split {
        return Err(format!(
            "{}: cutting the body at {cuts:?} changed the deltas\nwhole: {whole:?}\nsplit: {split:?}",
            format.name()
        ));
    }
    let mut accumulator = ResponseAccumulator::new("model");
    for delta in whole.iter().flatten() {
        accumulator.push(delta);
    }
    accumulator.finish();
    Ok(())
}

/// The SSE reader on any body: the events do not depend on the chunking either.
pub fn events(body: &[u8], cuts: &[usize]) -> Check {
    let read = |chunks| -> Vec<Result<(String, String, String), String>> {
        let events = sse::events("fuzz", source(chunks), sse::MAX_EVENT_BYTES).collect::<Vec<_>>();
        futures::executor::block_on(events)
            .into_iter()
            .map(|item| {
                item.map(|event| {
                    (
                        event.event.to_string(),
                        event.data.to_string(),
                        event.id.to_string(),
                    )
                })
                .map_err(|error| error.to_string())
            })
            .collect()
    };
    let whole = read(vec![Bytes::copy_from_slice(body)]);
    let split = read(chunks(body, cuts));
    if whole != split {
        return Err(format!(
            "cutting the body at {cuts:?} changed the events\nwhole: {whole:?}\nsplit: {split:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use baton_testkit::{Answer, CitationReply, ToolCallReply, bedrock, gemini, mock, responses};
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    /// The mock provider's body for a small answer: the real wire format of each provider.
    fn body(format: Format, text: &str) -> Vec<u8> {
        let answer = Answer {
            text: text.to_owned(),
            tool_calls: vec![ToolCallReply {
                id: "call_1".into(),
                name: "lookup".into(),
                arguments: json!({"q": text}),
            }],
            tokens_in: 12,
            tokens_out: 7,
            model: "m".into(),
            web_searches: 1,
            citations: vec![CitationReply {
                url: "https://example.com/".into(),
                title: "Example".into(),
            }],
        };
        match format {
            Format::OpenAiChat => mock::openai_stream(&answer),
            Format::OpenAiResponses => responses::stream(&answer),
            Format::Anthropic => mock::anthropic_stream(&answer),
            Format::Gemini => gemini::stream(&answer),
            Format::Bedrock => bedrock::stream(&answer),
        }
    }

    /// A real body, then bytes overwritten, cut out or spliced in: mostly well-formed framing
    /// with damage here and there, where the parsers' edge cases are.
    fn damaged(format: Format) -> impl Strategy<Value = (Vec<u8>, Vec<usize>, bool)> {
        (
            "[a-zé✓ ]{0,12}",
            prop::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 0..6),
            prop::collection::vec(any::<usize>(), 0..8),
            any::<bool>(),
        )
            .prop_map(move |(text, edits, cuts, structured)| {
                let mut bytes = body(format, &text);
                for (at, byte, kind) in edits {
                    let at = at % (bytes.len() + 1);
                    match kind {
                        0 if at < bytes.len() => bytes[at] = byte,
                        1 if at < bytes.len() => {
                            bytes.remove(at);
                        }
                        _ => bytes.insert(at, byte),
                    }
                }
                (bytes, cuts, structured)
            })
    }

    fn pass(check: Check) -> Result<(), TestCaseError> {
        check.map_err(TestCaseError::fail)
    }

    #[test]
    fn real_bodies_parse_the_same_at_every_cut() {
        for format in Format::ALL {
            let body = body(format, "héllo ✓");
            // Byte by byte, then in two at a spread of places (every place is the fuzzer's job).
            let every: Vec<usize> = (0..body.len()).collect();
            stream(format, &body, &every, false).unwrap();
            for cut in (0..body.len()).step_by(17) {
                stream(format, &body, &[cut], true).unwrap();
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn openai_chat_streams(case in damaged(Format::OpenAiChat)) {
            pass(stream(Format::OpenAiChat, &case.0, &case.1, case.2))?;
        }

        #[test]
        fn openai_responses_streams(case in damaged(Format::OpenAiResponses)) {
            pass(stream(Format::OpenAiResponses, &case.0, &case.1, case.2))?;
        }

        #[test]
        fn anthropic_streams(case in damaged(Format::Anthropic)) {
            pass(stream(Format::Anthropic, &case.0, &case.1, case.2))?;
        }

        #[test]
        fn gemini_streams(case in damaged(Format::Gemini)) {
            pass(stream(Format::Gemini, &case.0, &case.1, case.2))?;
        }

        #[test]
        fn bedrock_streams(case in damaged(Format::Bedrock)) {
            pass(stream(Format::Bedrock, &case.0, &case.1, case.2))?;
        }

        #[test]
        fn sse_events(case in damaged(Format::Anthropic)) {
            pass(events(&case.0, &case.1))?;
        }
    }
}
