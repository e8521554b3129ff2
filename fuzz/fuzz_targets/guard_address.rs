#![no_main]
//! The outbound guard's address checks: an IPv4 address (first 4 bytes) in every spelling, an
//! IPv6 address (first 16 bytes), and the whole input as a URL.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(four) = data.first_chunk::<4>() {
        baton_fuzz::check(baton_tools::fuzz::address(IpAddr::V4(Ipv4Addr::from(
            *four,
        ))));
    }
    if let Some(sixteen) = data.first_chunk::<16>() {
        baton_fuzz::check(baton_tools::fuzz::address(IpAddr::V6(Ipv6Addr::from(
            *sixteen,
        ))));
    }
    baton_fuzz::check(baton_tools::fuzz::url(&baton_fuzz::text(data)));
});
