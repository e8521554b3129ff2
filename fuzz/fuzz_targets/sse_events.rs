#![no_main]
//! The SSE reader under every provider but Bedrock: the same events however the body is cut.

use baton_fuzz::StreamCase;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let case = StreamCase::read(data);
    baton_fuzz::check(baton_providers::fuzz::events(case.body, &case.cuts));
});
