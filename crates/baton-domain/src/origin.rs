//! Callback origins: which hosts a tenant lets Baton call back for caller-hosted tools.
//!
//! A pattern is an origin with optional scheme and port (`https://app.example.com:8443`,
//! `app.example.com`), or a subdomain wildcard (`*.example.com`, optionally with scheme and port).
//! Scheme and port, when given, must match; `*.example.com` matches subdomains only, never the bare
//! domain nor look-alikes such as `badexample.com`.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use url::{Host, Url};

use crate::{DomainError, DomainResult};

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Exact(String),
    /// Matches hosts that end in `.<domain>` with at least one more label.
    Subdomains(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackOrigin {
    scheme: Option<String>,
    host: HostPattern,
    port: Option<u16>,
}

impl CallbackOrigin {
    /// Parses one pattern; `param` names the field in the error.
    pub fn parse(raw: &str, param: &str) -> DomainResult<Self> {
        let invalid = |why: &str| {
            DomainError::validation(param, format!("invalid callback origin '{raw}': {why}"))
        };
        let text = raw.trim();
        if text.is_empty() {
            return Err(invalid("it is empty"));
        }
        if text.chars().any(char::is_whitespace) {
            return Err(invalid("it contains white space"));
        }
        let (scheme, rest) = match text.split_once("://") {
            Some((scheme, rest)) => {
                let scheme = scheme.to_ascii_lowercase();
                if scheme != "http" && scheme != "https" {
                    return Err(invalid("the scheme must be http or https"));
                }
                (Some(scheme), rest)
            }
            None => (None, text),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#', '@', '\\']) {
            return Err(invalid(
                "an origin has no path, query, fragment or user info",
            ));
        }
        let (wildcard, authority) = match rest.strip_prefix("*.") {
            Some(after) => (true, after),
            None => (false, rest),
        };
        // The URL parser decodes `%2a` into `*`, which the stored form could not be read back
        // from: an origin is written as it is, never percent-encoded.
        if authority.contains('%') {
            return Err(invalid("an origin is written without percent-encoding"));
        }
        if authority.contains('*') {
            return Err(invalid("'*' is allowed only as a leading '*.' label"));
        }
        // Let the URL parser validate and normalise host and port (IDNA, case, IPv6 brackets).
        let probe = format!("{}://{authority}", scheme.as_deref().unwrap_or("http"));
        let url = Url::parse(&probe).map_err(|e| invalid(&e.to_string()))?;
        if url.path() != "/" || url.query().is_some() || !url.username().is_empty() {
            return Err(invalid("an origin has no path, query or user info"));
        }
        let host = match url.host() {
            // `example.com.` is the same name as `example.com`; `matches` drops a callback's
            // final dot too, so the pattern must not keep one it could never match.
            Some(Host::Domain(domain)) => {
                let name = domain.strip_suffix('.').unwrap_or(domain);
                // The URL parser allows empty labels (`a..b`, `...`); no host has them, and
                // dropping dots from such a name would change the pattern on every save.
                if name.split('.').any(str::is_empty) {
                    return Err(invalid("the host name has an empty label"));
                }
                // DNS's bounds (RFC 1035): no host is longer, so none could ever match.
                if name.len() > 253 || name.split('.').any(|label| label.len() > 63) {
                    return Err(invalid(
                        "a host name has labels of at most 63 characters, 253 in all",
                    ));
                }
                name.to_string()
            }
            Some(Host::Ipv4(ip)) if !wildcard => ip.to_string(),
            Some(Host::Ipv6(ip)) if !wildcard => format!("[{ip}]"),
            Some(_) => return Err(invalid("a wildcard needs a domain name, not an IP address")),
            None => return Err(invalid("the host is missing")),
        };
        // The parser drops a port equal to the scheme default; keep what the user wrote.
        let port = match url.port() {
            Some(port) => Some(port),
            None if authority_has_port(authority) => url.port_or_known_default(),
            None => None,
        };
        if port == Some(0) {
            return Err(invalid("port 0 is not a valid port"));
        }
        let host = if wildcard {
            if !host.contains('.') {
                return Err(invalid(
                    "a wildcard must cover a domain of at least two labels",
                ));
            }
            HostPattern::Subdomains(host)
        } else {
            HostPattern::Exact(host)
        };
        Ok(Self { scheme, host, port })
    }

    /// Whether a callback URL (`https://host:port/...`) is allowed by this pattern.
    pub fn matches(&self, callback: &Url) -> bool {
        if let Some(scheme) = &self.scheme
            && scheme != callback.scheme()
        {
            return false;
        }
        if let Some(port) = self.port
            && Some(port) != callback.port_or_known_default()
        {
            return false;
        }
        let host = match callback.host() {
            // One final dot is the same name; `host..` has an empty label and is another name.
            Some(Host::Domain(domain)) => domain
                .strip_suffix('.')
                .unwrap_or(domain)
                .to_ascii_lowercase(),
            Some(Host::Ipv4(ip)) => ip.to_string(),
            Some(Host::Ipv6(ip)) => format!("[{ip}]"),
            None => return false,
        };
        match &self.host {
            HostPattern::Exact(expected) => host == *expected,
            HostPattern::Subdomains(domain) => host
                .strip_suffix(domain.as_str())
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|label| !label.is_empty()),
        }
    }
}

fn authority_has_port(authority: &str) -> bool {
    // `[::1]:443` or `host:443`; a bare IPv6 literal's colons sit inside the brackets.
    match authority.rfind(']') {
        Some(end) => authority[end..].contains(':'),
        None => authority.contains(':'),
    }
}

impl fmt::Display for CallbackOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(scheme) = &self.scheme {
            write!(f, "{scheme}://")?;
        }
        match &self.host {
            HostPattern::Exact(host) => f.write_str(host)?,
            HostPattern::Subdomains(domain) => write!(f, "*.{domain}")?,
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

impl Serialize for CallbackOrigin {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CallbackOrigin {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Self::parse(&raw, "callbackOrigins").map_err(serde::de::Error::custom)
    }
}

/// Parses a list given as an array of strings or as one string with an origin per line.
pub fn parse_origin_list(lines: &[String], param: &str) -> DomainResult<Vec<CallbackOrigin>> {
    let mut origins: Vec<CallbackOrigin> = Vec::new();
    for (index, line) in lines.iter().flat_map(|l| l.lines()).enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let origin = CallbackOrigin::parse(line, &format!("{param}[{index}]"))?;
        if !origins.contains(&origin) {
            origins.push(origin);
        }
    }
    Ok(origins)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(pattern: &str, url: &str, expected: bool) {
        let origin = CallbackOrigin::parse(pattern, "o").unwrap();
        let url = Url::parse(url).unwrap();
        assert_eq!(origin.matches(&url), expected, "{pattern} vs {url}");
    }

    #[test]
    fn exact_hosts() {
        check("app.example.com", "https://app.example.com/tools", true);
        check("app.example.com", "http://APP.example.com:9000/x", true);
        check("app.example.com", "https://example.com/", false);
        check("app.example.com", "https://app.example.com.evil.io/", false);
    }

    #[test]
    fn scheme_and_port_must_match_when_given() {
        check("https://app.example.com", "http://app.example.com/", false);
        check(
            "https://app.example.com",
            "https://app.example.com:8443/",
            true,
        );
        check(
            "https://app.example.com:8443",
            "https://app.example.com/",
            false,
        );
        check(
            "https://app.example.com:443",
            "https://app.example.com/",
            true,
        );
        check("app.example.com:8080", "http://app.example.com:8080/", true);
        check(
            "app.example.com:8080",
            "http://app.example.com:8081/",
            false,
        );
    }

    #[test]
    fn wildcards_match_subdomains_only() {
        check("*.example.com", "https://a.example.com/", true);
        check("*.example.com", "https://a.b.example.com/", true);
        check("*.example.com", "https://example.com/", false);
        check("*.example.com", "https://badexample.com/", false);
        check("*.example.com", "https://a.example.com.evil.io/", false);
        check(
            "https://*.example.com:8443",
            "https://a.example.com:8443/",
            true,
        );
        check(
            "https://*.example.com:8443",
            "https://a.example.com/",
            false,
        );
    }

    /// Found by fuzzing: a pattern written with the root dot never matched anything.
    #[test]
    fn a_final_dot_is_the_same_name() {
        check("a.", "http://a./callback", true);
        check("app.example.com.", "https://app.example.com/", true);
        check("*.example.com.", "https://x.example.com./", true);
        // Found by fuzzing: only one final dot is dropped; `j..` has an empty last label.
        check("https://J", "https://j../cb", false);
        check("*.example.com", "https://x.example.com../cb", false);
        assert_eq!(
            CallbackOrigin::parse("https://app.example.com.:8443", "o")
                .unwrap()
                .to_string(),
            "https://app.example.com:8443"
        );
        assert!(CallbackOrigin::parse("*.com.", "o").is_err());
        // Found by fuzzing: "..." was stored as "..", which read back as ".".
        for bad in [
            "...........",
            ".",
            "a..example.com",
            ".example.com",
            "*..example.com",
            // Found by fuzzing: stored as "2~*.c", which did not read back.
            "2~%2a.c",
            "%61pp.example.com",
        ] {
            assert!(CallbackOrigin::parse(bad, "o").is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn ip_literals() {
        check("http://10.0.0.1:3000", "http://10.0.0.1:3000/x", true);
        check("[::1]:3000", "http://[::1]:3000/x", true);
    }

    #[test]
    fn rejects_malformed_patterns() {
        for bad in [
            "",
            "   ",
            "ftp://example.com",
            "https://example.com/path",
            "example.com?x=1",
            "user@example.com",
            "*",
            "*.com",
            "a.*.example.com",
            "*.10.0.0.1",
            "exa mple.com",
            "example.com:99999",
            "example.com:0",
            "https://",
            &format!("{}.example.com", "a".repeat(64)),
            &format!("{}example.com", "abcdefgh.".repeat(28)),
        ] {
            assert!(CallbackOrigin::parse(bad, "o").is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn normalises_and_round_trips() {
        let o = CallbackOrigin::parse("HTTPS://App.Example.com:8443/", "o").unwrap();
        assert_eq!(o.to_string(), "https://app.example.com:8443");
        assert_eq!(CallbackOrigin::parse(&o.to_string(), "o").unwrap(), o);
        let w = CallbackOrigin::parse("*.Example.COM", "o").unwrap();
        assert_eq!(w.to_string(), "*.example.com");
    }

    #[test]
    fn list_accepts_newline_separated_text_and_names_the_bad_line() {
        let list = parse_origin_list(
            &["a.example.com\n\n*.b.example.com\na.example.com".into()],
            "callbackOrigins",
        )
        .unwrap();
        assert_eq!(list.len(), 2);
        let err = parse_origin_list(
            &["a.example.com".into(), "bad/path".into()],
            "callbackOrigins",
        )
        .unwrap_err();
        let DomainError::Validation { param, .. } = err;
        assert_eq!(param, "callbackOrigins[1]");
    }
}
