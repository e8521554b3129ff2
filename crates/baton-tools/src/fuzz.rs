//! The outbound guard's address invariants, shared by the fuzz target (`fuzz/`) and the property
//! tests. Not an API: compiled for tests and with the `fuzzing` feature only. A check returns the
//! invariant it found broken.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

use crate::guard::{GuardPolicy, is_forbidden};

pub type Check = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            return Err(format!($($arg)*));
        }
    };
}

/// What the standard library itself calls non-public IPv4 (plus the ranges it has no stable
/// method for): the guard must refuse at least these.
fn reserved_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_unspecified()
        || ip.is_multicast()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // shared (CGNAT)
        || a >= 240 // reserved
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
}

/// The IPv4 address an IPv6 address carries in one of the spellings that reach it: mapped,
/// compatible, NAT64 (well-known and local-use prefixes), 6to4 and Teredo (client, inverted).
fn embedded_v4(ip: Ipv6Addr) -> Vec<Ipv4Addr> {
    let s = ip.segments();
    let low = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    let mut found = Vec::new();
    if s[..5] == [0; 5] && (s[5] == 0 || s[5] == 0xffff) {
        found.push(low(s[6], s[7]));
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || s[..3] == [0x64, 0xff9b, 1] {
        found.push(low(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        found.push(low(s[1], s[2]));
    }
    if s[0] == 0x2001 && s[1] == 0 {
        found.push(low(!s[6], !s[7]));
        found.push(low(s[2], s[3])); // the Teredo server
    }
    found
}

fn reserved_v6(ip: Ipv6Addr) -> bool {
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || ip.is_unique_local()
        || ip.is_unicast_link_local()
        || (ip.segments()[0] & 0xffc0) == 0xfec0 // site-local
        || ip.segments()[..2] == [0x2001, 0xdb8] // documentation
        || embedded_v4(ip).into_iter().any(reserved_v4)
}

/// `is_forbidden` refuses every reserved address, an IPv4-mapped address exactly as its IPv4
/// form, and every reserved IPv4 address in every spelling a URL can give it.
pub fn address(ip: IpAddr) -> Check {
    let refused = is_forbidden(ip);
    match ip {
        IpAddr::V4(v4) => {
            ensure!(!reserved_v4(v4) || refused, "{ip} is reserved but allowed");
            let mapped = IpAddr::V6(v4.to_ipv6_mapped());
            ensure!(
                is_forbidden(mapped) == refused,
                "{ip} and {mapped} are judged differently"
            );
            if refused {
                for spelling in spellings(v4) {
                    url_refused(&spelling, v4)?;
                }
            }
        }
        IpAddr::V6(v6) => {
            ensure!(!reserved_v6(v6) || refused, "{ip} is reserved but allowed");
            if let Some(v4) = v6.to_ipv4_mapped() {
                ensure!(
                    refused == is_forbidden(IpAddr::V4(v4)),
                    "{ip} and {v4} are judged differently"
                );
            }
        }
    }
    Ok(())
}

/// A URL host naming `ip` must come out of the URL parser as that address (not as a name the
/// guard would leave to the resolver) and be refused.
fn url_refused(host: &str, ip: Ipv4Addr) -> Check {
    let raw = format!("http://{host}:8080/path");
    let url = Url::parse(&raw).map_err(|e| format!("{raw}: {e}"))?;
    ensure!(
        !matches!(url.host(), Some(Host::Domain(_)) | None),
        "{raw} (for {ip}) parses as the name {:?}",
        url.host_str()
    );
    ensure!(
        GuardPolicy::strict().check_url(&url).is_err(),
        "{raw} (for {ip}) is let through"
    );
    Ok(())
}

/// The ways a URL can write an IPv4 address (WHATWG host parsing plus IPv6 embeddings).
pub fn spellings(ip: Ipv4Addr) -> Vec<String> {
    let n = u32::from(ip);
    let [a, b, c, d] = ip.octets();
    let (hi, lo) = (n >> 16, n & 0xffff);
    let teredo = format!(
        "[2001:0:4136:e378:8000:63bf:{:x}:{:x}]",
        !hi & 0xffff,
        !lo & 0xffff
    );
    let percent: String = ip
        .to_string()
        .bytes()
        .map(|byte| format!("%{byte:02x}"))
        .collect();
    vec![
        ip.to_string(),
        format!("{ip}."),
        n.to_string(),
        format!("0x{n:x}"),
        format!("0X{n:X}"),
        format!("0{n:o}"),
        format!("{a}.{b}.{}", (u32::from(c) << 8) | u32::from(d)),
        format!("{a}.{}", n & 0x00ff_ffff),
        format!("0x{a:x}.0{b:o}.{c}.0x{d:02x}"),
        format!("00{a:o}.00{b:o}.0{c:o}.0{d:o}"),
        percent,
        format!("[::ffff:{ip}]"),
        format!("[::ffff:{hi:x}:{lo:x}]"),
        format!("[0:0:0:0:0:ffff:{ip}]"),
        format!("[::{ip}]"),
        format!("[64:ff9b::{ip}]"),
        format!("[64:ff9b::{hi:x}:{lo:x}]"),
        format!("[64:ff9b:1::{hi:x}:{lo:x}]"),
        format!("[2002:{hi:x}:{lo:x}::1]"),
        teredo,
    ]
}

/// Any URL text: `check_url` on a strict policy refuses exactly the non-HTTP URLs, those without
/// a host and the reserved IP literals; names are left to the resolver.
pub fn url(raw: &str) -> Check {
    let Ok(url) = Url::parse(raw) else {
        return Ok(());
    };
    let refused = GuardPolicy::strict().check_url(&url).is_err();
    let http = matches!(url.scheme(), "http" | "https");
    let expected = match url.host() {
        _ if !http => true,
        None => true,
        Some(Host::Domain(_)) => false,
        Some(Host::Ipv4(ip)) => is_forbidden(IpAddr::V4(ip)),
        Some(Host::Ipv6(ip)) => is_forbidden(IpAddr::V6(ip)),
    };
    ensure!(
        refused == expected,
        "{raw}: refused {refused}, expected {expected}"
    );
    if let Some(Host::Ipv4(ip)) = url.host() {
        address(IpAddr::V4(ip))?;
    }
    if let Some(Host::Ipv6(ip)) = url.host() {
        address(IpAddr::V6(ip))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn pass(check: Check) -> Result<(), TestCaseError> {
        check.map_err(TestCaseError::fail)
    }

    /// Addresses near the edges of reserved ranges far more often than uniform ones would be.
    fn v4() -> impl Strategy<Value = Ipv4Addr> {
        prop_oneof![
            any::<u32>().prop_map(Ipv4Addr::from),
            (
                prop::sample::select(vec![
                    0u8, 10, 100, 127, 169, 172, 192, 198, 203, 224, 240, 255
                ]),
                any::<[u8; 3]>()
            )
                .prop_map(|(a, [b, c, d])| Ipv4Addr::new(a, b, c, d)),
        ]
    }

    fn v6() -> impl Strategy<Value = Ipv6Addr> {
        let prefixes: Vec<[u16; 3]> = vec![
            [0, 0, 0],
            [0x64, 0xff9b, 0],
            [0x64, 0xff9b, 1],
            [0x2001, 0, 0x4136],
            [0x2001, 0xdb8, 0],
            [0x2002, 0x7f00, 1],
            [0x2002, 0x5db8, 0xd822],
            [0xfc00, 0, 0],
            [0xfe80, 0, 0],
            [0xfec0, 0, 0],
            [0xff02, 0, 0],
            [0x2606, 0x4700, 0],
        ];
        prop_oneof![
            any::<u128>().prop_map(Ipv6Addr::from),
            (
                prop::sample::select(prefixes),
                any::<[u16; 5]>(),
                v4(),
                any::<bool>()
            )
                .prop_map(|(p, rest, ip, mapped)| {
                    let [x, y] = [(u32::from(ip) >> 16) as u16, u32::from(ip) as u16];
                    let tail = if mapped && p == [0, 0, 0] {
                        [0, 0, 0xffff, x, y]
                    } else if p[0] == 0x64 || p == [0, 0, 0] {
                        [0, 0, 0, x, y]
                    } else {
                        rest
                    };
                    Ipv6Addr::new(
                        p[0], p[1], p[2], tail[0], tail[1], tail[2], tail[3], tail[4],
                    )
                }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn reserved_v4_addresses_are_refused_in_every_spelling(ip in v4()) {
            pass(address(IpAddr::V4(ip)))?;
        }

        #[test]
        fn reserved_v6_addresses_are_refused(ip in v6()) {
            pass(address(IpAddr::V6(ip)))?;
        }

        #[test]
        fn check_url_refuses_exactly_the_reserved_literals(
            scheme in prop_oneof![Just("http"), Just("https"), Just("ftp"), Just("file")],
            host in prop_oneof![
                v4().prop_map(|ip| ip.to_string()),
                v6().prop_map(|ip| format!("[{ip}]")),
                "[0-9a-fx.]{1,16}",
                "[a-z0-9.]{1,12}",
            ],
        ) {
            pass(url(&format!("{scheme}://{host}/x")))?;
        }
    }
}
