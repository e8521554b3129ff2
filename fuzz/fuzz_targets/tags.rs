#![no_main]
//! The X-Baton-Tags header parser.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    baton_fuzz::check(baton_domain::fuzz::tag_header(&baton_fuzz::text(data)));
});
