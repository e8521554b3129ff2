#![no_main]
//! A set of templates: compile (cycles, duplicates), render every template, parameters.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (sources, value) = baton_fuzz::library(data);
    baton_fuzz::check(baton_template::fuzz::library(&sources, &value));
});
