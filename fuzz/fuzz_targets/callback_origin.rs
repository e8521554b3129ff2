#![no_main]
//! Callback-origin patterns: stored form round trip, self-match, agreement with a model for a
//! callback URL. Input: pattern, newline, callback URL.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = baton_fuzz::text(data);
    let (pattern, callback) = text.split_once('\n').unwrap_or((&text, ""));
    baton_fuzz::check(baton_domain::fuzz::origin(pattern, callback));
});
