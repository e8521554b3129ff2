#![no_main]
//! The openai_responses stream parser: the same deltas however the body is cut; they fold into a response.

use baton_fuzz::StreamCase;
use baton_providers::bench::Format;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let case = StreamCase::read(data);
    baton_fuzz::check(baton_providers::fuzz::stream(
        Format::OpenAiResponses,
        case.body,
        &case.cuts,
        case.structured,
    ));
});
