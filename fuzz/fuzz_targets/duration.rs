#![no_main]
//! The time-span parser (`7d`, `1.02:03:04`) of statistics periods.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    baton_fuzz::check(baton_domain::fuzz::span(&baton_fuzz::text(data)));
});
