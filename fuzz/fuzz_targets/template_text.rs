#![no_main]
//! One template text: syntax errors, discovery, render == the comment rules' model.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    baton_fuzz::check(baton_template::fuzz::text(&baton_fuzz::text(data)));
});
