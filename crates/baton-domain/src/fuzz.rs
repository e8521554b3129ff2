//! The invariants of the domain's text parsers, shared by the fuzz targets (`fuzz/`) and the
//! property tests so both check the same thing. Not an API: compiled for tests and with the
//! `fuzzing` feature only. A check returns the invariant it found broken; a panic inside a
//! parser is the other failure, which the callers see as such.

use url::{Host, Url};

use crate::DomainError;
use crate::origin::CallbackOrigin;
use crate::tags::{MAX_TAG_LEN, MAX_TAGS, parse_tag_header, validate_tags};
use crate::time::{MAX_SPAN_MS, MS_PER_DAY, parse_span};

/// `Err` names the broken invariant and the input that broke it.
pub type Check = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            return Err(format!($($arg)*));
        }
    };
}

fn param_of(err: &DomainError) -> &str {
    let DomainError::Validation { param, .. } = err;
    param
}

/// `parse_span`: errors name the field; white space around the text never matters; a count with
/// a unit means what it says; a span shown in the clock form (and in seconds) reads back the
/// same.
pub fn span(raw: &str) -> Check {
    let parsed = parse_span(raw, "period");
    if let Err(err) = &parsed {
        ensure!(param_of(err) == "period", "{raw:?}: error names {err:?}");
    }
    let padded = parse_span(&format!(" {raw}\t"), "period");
    ensure!(
        padded.as_ref().ok() == parsed.as_ref().ok(),
        "{raw:?}: padding changed {parsed:?} into {padded:?}"
    );
    let text = raw.trim();
    if let Some((count, per)) = count_with_unit(text) {
        let expected = count * per;
        let in_range = expected > 0 && expected <= MAX_SPAN_MS;
        ensure!(
            parsed.as_ref().ok() == in_range.then_some(&expected),
            "{raw:?}: expected {expected} ms (in range: {in_range}), got {parsed:?}"
        );
    }
    if let Ok(ms) = parsed {
        ensure!(
            ms > 0 && ms <= MAX_SPAN_MS,
            "{raw:?}: {ms} ms is out of range"
        );
        ensure!(ms % 1_000 == 0, "{raw:?}: {ms} ms is not whole seconds");
        let seconds = ms / 1_000;
        let clock = format!(
            "{}.{:02}:{:02}:{:02}",
            ms / MS_PER_DAY,
            seconds / 3_600 % 24,
            seconds / 60 % 60,
            seconds % 60
        );
        let back = parse_span(&clock, "period");
        ensure!(
            back.as_ref().ok() == Some(&ms),
            "{raw:?}: {clock:?} reads {back:?}, not {ms}"
        );
        if seconds <= 999_999_999 {
            let back = parse_span(&format!("{seconds}s"), "period");
            ensure!(
                back.as_ref().ok() == Some(&ms),
                "{raw:?}: {seconds}s reads {back:?}"
            );
        }
    }
    Ok(())
}

/// The unit form as the spec describes it: 1 to 9 ASCII digits, then one of `wdhms`.
fn count_with_unit(text: &str) -> Option<(i64, i64)> {
    let unit = text.chars().last()?;
    let digits = &text[..text.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 9 || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let per = match unit {
        'w' => 7 * MS_PER_DAY,
        'd' => MS_PER_DAY,
        'h' => 3_600_000,
        'm' => 60_000,
        's' => 1_000,
        _ => return None,
    };
    Some((digits.parse().ok()?, per))
}

/// `parse_tag_header`: accepted tags are trimmed, non-empty, bounded, free of control characters
/// and commas, have a key before any `:`, are unique and at most [`MAX_TAGS`]; written back as a
/// header or validated again they stay the same.
pub fn tag_header(header: &str) -> Check {
    let tags = match parse_tag_header(header) {
        Ok(tags) => tags,
        Err(err) => {
            ensure!(
                param_of(&err) == "X-Baton-Tags",
                "{header:?}: error names {err:?}"
            );
            return Ok(());
        }
    };
    ensure!(tags.len() <= MAX_TAGS, "{header:?}: {} tags", tags.len());
    for (index, tag) in tags.iter().enumerate() {
        ensure!(
            !tag.is_empty()
                && tag.trim() == tag
                && tag.chars().count() <= MAX_TAG_LEN
                && !tag.contains(',')
                && !tag.chars().any(char::is_control)
                && !tag.starts_with(':'),
            "{header:?}: accepted tag {tag:?}"
        );
        ensure!(!tags[..index].contains(tag), "{header:?}: {tag:?} twice");
    }
    let again = parse_tag_header(&tags.join(","));
    ensure!(
        again.as_ref().ok() == Some(&tags),
        "{header:?}: re-read as {again:?}"
    );
    let again = validate_tags(tags.clone(), "tags");
    ensure!(
        again.as_ref().ok() == Some(&tags),
        "{header:?}: re-validated as {again:?}"
    );
    Ok(())
}

/// `CallbackOrigin`: a pattern's stored form parses back to it; every pattern allows a callback
/// made from it; and `matches` agrees with a label-wise model of the rules for any URL.
pub fn origin(pattern: &str, callback: &str) -> Check {
    let origin = match CallbackOrigin::parse(pattern, "o") {
        Ok(origin) => origin,
        Err(err) => {
            ensure!(param_of(&err) == "o", "{pattern:?}: error names {err:?}");
            return Ok(());
        }
    };
    let shown = origin.to_string();
    let again = CallbackOrigin::parse(&shown, "o");
    ensure!(
        again.as_ref().ok() == Some(&origin),
        "{pattern:?} is stored as {shown:?}, which reads {again:?}"
    );
    let model = Model::of(&shown).ok_or_else(|| format!("{pattern:?}: cannot read {shown:?}"))?;

    let example = model.example();
    let url = Url::parse(&example).map_err(|e| format!("{pattern:?}: example {example:?}: {e}"))?;
    ensure!(
        origin.matches(&url),
        "{pattern:?} does not allow its own example {example}"
    );

    if let Ok(url) = Url::parse(callback) {
        let expected = model.matches(&url);
        ensure!(
            origin.matches(&url) == expected,
            "{pattern:?} (stored {shown:?}) vs {url}: model says {expected}"
        );
    }
    Ok(())
}

/// A pattern read back from its stored form.
struct Model<'a> {
    scheme: Option<&'a str>,
    wildcard: bool,
    host: &'a str,
    port: Option<u16>,
}

impl<'a> Model<'a> {
    fn of(shown: &'a str) -> Option<Model<'a>> {
        let (scheme, rest) = match shown.split_once("://") {
            Some((scheme, rest)) => (Some(scheme), rest),
            None => (None, shown),
        };
        let (wildcard, rest) = match rest.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, rest),
        };
        // A port follows the last ':' outside an IPv6 literal's brackets.
        let host_end = rest.rfind(']').map_or(0, |end| end + 1);
        let (host, port) = match rest[host_end..].rfind(':') {
            Some(colon) => {
                let colon = host_end + colon;
                (&rest[..colon], Some(rest[colon + 1..].parse().ok()?))
            }
            None => (rest, None),
        };
        Some(Model {
            scheme,
            wildcard,
            host,
            port,
        })
    }

    fn example(&self) -> String {
        let mut url = format!("{}://", self.scheme.unwrap_or("http"));
        if self.wildcard {
            url.push_str("sub.");
        }
        url.push_str(self.host);
        if let Some(port) = self.port {
            url.push_str(&format!(":{port}"));
        }
        url.push_str("/callback");
        url
    }

    /// Host names compare by labels, case-insensitively, a final root dot ignored.
    fn matches(&self, url: &Url) -> bool {
        if self.scheme.is_some_and(|scheme| scheme != url.scheme()) {
            return false;
        }
        if self.port.is_some() && self.port != url.port_or_known_default() {
            return false;
        }
        let host = match url.host() {
            Some(Host::Domain(domain)) => domain.to_ascii_lowercase(),
            Some(Host::Ipv4(ip)) => ip.to_string(),
            Some(Host::Ipv6(ip)) => format!("[{ip}]"),
            None => return false,
        };
        let labels = |name: &str| -> Vec<String> {
            let name = name.strip_suffix('.').unwrap_or(name);
            name.split('.').map(str::to_ascii_lowercase).collect()
        };
        let (got, want) = (labels(&host), labels(self.host));
        if self.wildcard {
            got.len() > want.len() && got.ends_with(&want)
        } else {
            got == want
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn pass(check: Check) -> Result<(), TestCaseError> {
        check.map_err(TestCaseError::fail)
    }

    fn span_text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[0-9]{0,10}[wdhmsx]?",
            "[0-9]{1,3}\\.[0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}",
            "[0-9: .dhé\\-]{0,12}",
            any::<String>(),
        ]
    }

    fn tag_text() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::collection::vec("[ a-zA-Z:,\t\u{7f}é]{0,8}", 0..30).prop_map(|t| t.join(",")),
            any::<String>(),
        ]
    }

    fn origin_pattern() -> impl Strategy<Value = String> {
        (
            prop_oneof![
                Just(""),
                Just("http://"),
                Just("https://"),
                Just("HTTPS://")
            ],
            prop_oneof![Just(""), Just("*.")],
            prop_oneof![
                "[a-zA-Z0-9-]{1,5}(\\.[a-zA-Z0-9-]{1,5}){0,3}\\.?",
                Just("10.0.0.1".to_string()),
                Just("[::1]".to_string()),
                Just("bücher.example".to_string()),
                any::<String>(),
            ],
            prop_oneof![Just(String::new()), "(:[0-9]{1,6})"],
            prop_oneof![Just(""), Just("/")],
        )
            .prop_map(|(scheme, wildcard, host, port, slash)| {
                format!("{scheme}{wildcard}{host}{port}{slash}")
            })
    }

    fn callback_url() -> impl Strategy<Value = String> {
        (
            prop_oneof![Just("http"), Just("https"), Just("ftp")],
            "[a-zA-Z0-9-]{0,4}(\\.[a-zA-Z0-9-]{0,5}){0,4}\\.?",
            prop_oneof![Just(String::new()), "(:[0-9]{1,5})"],
        )
            .prop_map(|(scheme, host, port)| format!("{scheme}://{host}{port}/cb"))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn spans_hold_their_invariants(raw in span_text()) {
            pass(span(&raw))?;
        }

        #[test]
        fn tag_headers_hold_their_invariants(header in tag_text()) {
            pass(tag_header(&header))?;
        }

        #[test]
        fn origins_agree_with_the_model(pattern in origin_pattern(), callback in callback_url()) {
            pass(origin(&pattern, &callback))?;
        }

        #[test]
        fn origins_match_their_own_subdomains(
            labels in prop::collection::vec("[a-z0-9]{1,4}", 2..4),
            sub in "[a-z0-9]{1,4}",
        ) {
            let domain = labels.join(".");
            pass(origin(&format!("*.{domain}"), &format!("https://{sub}.{domain}/")))?;
            pass(origin(&domain, &format!("https://{sub}.{domain}/")))?;
        }
    }
}
